"""Registers the multi-agent envs (kind ``pettingzoo``) under short names.

* every mpe2 scenario (mpe2 does not register itself): ``simple_spread``, ``simple_spread_v3``,
  ``simple_speaker_listener``, ``simple_tag``, ...;
* every id of PettingZoo 1.27's parallel registry: ``pursuit`` / ``pursuit_v5``, ``pistonball``,
  ``multiwalker``, ``knights_archers_zombies``, the Atari two-player games, ...

The factories return PettingZoo *Parallel* envs (:func:`grpo_marl.marl.envs.make_parallel_env`);
AEC-only registry ids are reachable as ``env=pz:<namespace>/<name>-v<N>`` through
``aec_to_parallel``. Importing this module only reads PettingZoo's registry table (entry points
are strings), so it stays cheap.

The three shipped tasks carry tuned config defaults (applied under command-line overrides):
``simple_spread`` (N=3, 25 steps), ``simple_speaker_listener`` (heterogeneous speaker/listener
groups) and ``pursuit`` (shrunk to an 8x8 grid, 4 pursuers, 4 evaders, 50 steps so it trains
here in minutes).

Which GRPO grouping carries signal depends on the reward: simple_spread (``local_ratio=0.5``)
mixes a team reward with individual collision penalties, so ``agent`` groups see only the
collision part; simple_speaker_listener and pursuit give every agent the *same* reward, so
``agent`` groups have zero variance (no signal, ``rollout/frac_zero_std_groups`` = 1) and only
``seed``/``state`` groups (comparisons across copies of one joint state) can learn.
"""

from __future__ import annotations

import functools
from pathlib import Path

from envs import CONF_DIR
from grpo_marl.marl.envs import MARL_ENVS, make_parallel_env
from grpo_marl.registry import register_env


def tuned_defaults(name: str) -> Path | None:
    """The tuned-defaults file of a shipped multi-agent task (``envs/conf/<name>.yaml``, tuned on
    the 2-core CPU: see benchmarks/marl.py), or None for the tasks that have none."""
    path = CONF_DIR / f"{name}.yaml"
    return path if path.is_file() else None


# Solve thresholds on the mean per-agent episode return (mpe2 / PettingZoo reward scale).
THRESHOLDS: dict[str, float] = {"simple_spread": -9.0}


def _register_all() -> None:
    seen: set[str] = set()
    for key, info in MARL_ENVS.items():
        if "/" in key or key in seen:
            continue
        seen.add(key)
        register_env(
            key,
            functools.partial(make_parallel_env, key),
            kind="pettingzoo",
            defaults=tuned_defaults(info.name),
            threshold=THRESHOLDS.get(info.name),
            description=info.description,
        )


_register_all()
