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
from typing import Any

from grpo_marl.marl.envs import MARL_ENVS, make_parallel_env
from grpo_marl.registry import register_env

# Config overrides per shipped task, per algorithm ("common" applies to all; see
# grpo_marl.config.env_defaults). Tuned on the 2-core CPU; see benchmarks/marl.py.
TUNED: dict[str, dict[str, Any]] = {
    # GRPO, final greedy eval of 1000 episodes (greedy scripted assignment: -8.82): -8.23 / -8.17 /
    # -8.68 over seeds 1-3 at 2.5M steps, 150 s for seed 1 on one core of this machine (the 1.5M of
    # before gave -9.16 median: results/marl/simple_spread_ports.md). Fewer gradient passes cost far
    # more steps here (seed 1 at 1.5M: 2 epochs x 2 minibatches -12.95, 4 x 2 -10.08, 8 groups x 8
    # -9.14; 16 groups, 4 x 4: -9.25).
    "simple_spread": {
        "common": {"total_steps": 2_500_000, "eval": {"episodes": 100}},
        "grpo": {
            "algo": {"group_size": 8, "num_groups": 16, "lr": 0.003, "lr_schedule": "linear", "group_mode": "seed"},
        },
        # with the (default) time-aware critic, lr 2e-3: MAPPO -12.96, IPPO -12.41 at 400k (lr 7e-4: -16.08)
        "mappo": {"algo": {"lr": 0.002}},
        "ippo": {"algo": {"lr": 0.002}},
    },
    "simple_speaker_listener": {
        "common": {"total_steps": 1_000_000, "eval": {"episodes": 100}},
        "grpo": {"algo": {"group_size": 8, "num_groups": 16, "lr": 0.003, "group_mode": "seed"}},
    },
    # pursuit's reward is a team reward (shared_reward=True): only seed/state groups carry signal
    "pursuit": {
        "common": {"total_steps": 100_000, "eval": {"episodes": 16}},
        "grpo": {"algo": {"group_size": 4, "num_groups": 4, "lr": 0.003, "group_mode": "seed"}},
        "mappo": {"algo": {"n_envs": 16}},
        "ippo": {"algo": {"n_envs": 16}},
    },
    # -- butterfly / sisl families (pip install -e ".[marl-extra]"); see grpo_marl/marl/preprocess.py.
    # Image envs: SuperSuit grayscale + resize + frame stack keep observations small uint8 arrays
    # (cooperative_pong 280x480x3 -> 48x48x4: 9 KB instead of 403 KB per agent-step).
    "cooperative_pong": {
        "common": {
            "total_steps": 200_000,
            "eval": {"episodes": 8},
            "env_preprocess": {"color_reduction": "full", "resize": [48, 48], "frame_stack": 4},
        },
        # random play ends an episode after ~60 steps, so early GRPO batches are short
        "grpo": {"algo": {"group_size": 4, "num_groups": 4, "lr": 0.00025, "group_mode": "seed", "minibatches": 4}},
        "mappo": {"algo": {"n_envs": 8, "n_steps": 128, "batch_size": 512, "epochs": 4, "lr": 0.00025}},
        "ippo": {"algo": {"n_envs": 8, "n_steps": 128, "batch_size": 512, "epochs": 4, "lr": 0.00025}},
    },
    "pistonball": {
        "common": {
            "total_steps": 100_000,
            "eval": {"episodes": 4},
            "env_preprocess": {"color_reduction": "full", "resize": [48, 48], "frame_stack": 3},
        },
        "grpo": {"algo": {"group_size": 4, "num_groups": 2, "lr": 0.00025, "group_mode": "seed", "minibatches": 8}},
        "mappo": {"algo": {"n_envs": 4, "n_steps": 125, "batch_size": 1000, "epochs": 4, "lr": 0.00025}},
        "ippo": {"algo": {"n_envs": 4, "n_steps": 125, "batch_size": 1000, "epochs": 4, "lr": 0.00025}},
    },
    "knights_archers_zombies": {
        "common": {"total_steps": 500_000, "eval": {"episodes": 8}},
        "grpo": {"algo": {"group_size": 4, "num_groups": 4, "lr": 0.0003, "group_mode": "seed"}},
        "mappo": {"algo": {"n_envs": 8, "n_steps": 128, "batch_size": 1024, "epochs": 4, "lr": 0.0003}},
        "ippo": {"algo": {"n_envs": 8, "n_steps": 128, "batch_size": 1024, "epochs": 4, "lr": 0.0003}},
    },
    "knights_archers_zombies_image": {
        "common": {
            "total_steps": 100_000,
            "eval": {"episodes": 4},
            "env_preprocess": {"color_reduction": "full", "resize": [64, 64], "frame_stack": 1},
        },
        "grpo": {"algo": {"group_size": 2, "num_groups": 2, "lr": 0.00025, "group_mode": "seed", "minibatches": 8}},
        "mappo": {"algo": {"n_envs": 4, "n_steps": 128, "batch_size": 512, "epochs": 4, "lr": 0.00025}},
        "ippo": {"algo": {"n_envs": 4, "n_steps": 128, "batch_size": 512, "epochs": 4, "lr": 0.00025}},
    },
    # continuous actions (4 torques per walker); a fallen walker ends the episode (-100)
    "multiwalker": {
        "common": {"total_steps": 1_000_000, "eval": {"episodes": 8}},
        "grpo": {"algo": {"group_size": 8, "num_groups": 4, "lr": 0.0003, "group_mode": "seed"}},
        "mappo": {"algo": {"n_envs": 16, "n_steps": 128, "batch_size": 1024, "epochs": 10, "lr": 0.0003}},
        "ippo": {"algo": {"n_envs": 16, "n_steps": 128, "batch_size": 1024, "epochs": 10, "lr": 0.0003}},
    },
}

# Solve thresholds on the mean per-agent episode return (mpe2 / PettingZoo reward scale).
THRESHOLDS: dict[str, float] = {"simple_spread": -9.0}


def _register_all() -> None:
    seen: set[str] = set()
    for key, info in MARL_ENVS.items():
        if "/" in key or key in seen:
            continue
        seen.add(key)
        tuned = TUNED.get(info.name, {})
        register_env(
            key,
            functools.partial(make_parallel_env, key),
            kind="pettingzoo",
            defaults=tuned,
            threshold=THRESHOLDS.get(info.name),
            description=info.description,
        )


_register_all()
