"""Construction of PettingZoo Parallel envs under short names, and the direct mpe2 driver.

Two sources:

* **mpe2** (MPE moved out of PettingZoo and does *not* register itself): every scenario module in
  ``mpe2`` is reachable as ``simple_spread`` / ``simple_spread_v3``. By default these are built as
  :class:`MPEParallelEnv`, a direct Parallel-API driver of mpe2's ``raw_env`` that skips the
  AEC round-robin (same observations/rewards as ``mpe2.<x>.parallel_env``, checked in the tests,
  ~35% faster) and knows how to snapshot itself. ``fast=False`` returns mpe2's own
  ``aec_to_parallel`` env instead.
* **PettingZoo 1.27's registry** (``pettingzoo.make``): every id in ``pettingzoo.parallel_registry``
  is reachable as ``pursuit`` / ``pursuit_v5`` / ``sisl/pursuit-v5``. Any AEC-only id can be asked
  for as ``pz:<namespace>/<name>-v<N>``; it is wrapped with ``aec_to_parallel`` (which refuses
  turn-based games, since those are not parallelizable).

Snapshots: ``copy.deepcopy`` of these envs does **not** copy their state — ``EzPickle`` rebuilds a
fresh env from the constructor arguments. :class:`MPEParallelEnv` therefore snapshots mpe2's world,
step counter and RNG itself; :func:`grpo_marl.vec.snapshot.snapshot_env` (the one snapshot entry
point for every env kind) asks it to, and pickles other PettingZoo envs with ``EzPickle`` bypassed.
"""

from __future__ import annotations

import copy
import importlib
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Mirrors mpe2.all_modules.mpe_environments (checked by a test); kept static so that registering
# the short names does not import pygame and every scenario.
MPE2_MODULES: tuple[str, ...] = (
    "collect_treasure_v1",
    "simple_v3",
    "simple_adversary_v3",
    "simple_crypto_v3",
    "simple_formation_v1",
    "simple_line_v1",
    "simple_push_v3",
    "simple_reference_v3",
    "simple_speaker_listener_v4",
    "simple_spread_v3",
    "simple_tag_v3",
    "simple_world_comm_v3",
)

_VERSION_SUFFIX = re.compile(r"_v\d+$")


@dataclass(frozen=True)
class MarlEnvInfo:
    """What a short name points at.

    source: ``"mpe2"`` (target = mpe2 module name, e.g. ``simple_spread_v3``) or ``"pettingzoo"``
    (target = registry id, e.g. ``sisl/pursuit-v5``). defaults: env kwargs applied under the
    caller's kwargs (the settings this project tuned for; empty means the library defaults).
    """

    name: str
    source: str
    target: str
    defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""


# Tuned defaults for the shipped tasks. pursuit is shrunk (8x8 grid, 4 pursuers, 4 evaders,
# 50 cycles) so that it trains on a 2-core CPU in minutes (the env runs only a few hundred steps/s
# per process); the library default (16x16, 8 pursuers, 30 evaders, 500 cycles) is one kwarg away.
_SHIPPED_DEFAULTS: dict[str, dict[str, Any]] = {
    "simple_spread_v3": {"N": 3, "max_cycles": 25, "local_ratio": 0.5},
    "simple_speaker_listener_v4": {"max_cycles": 25},
    "sisl/pursuit-v5": {
        "x_size": 8,
        "y_size": 8,
        "n_pursuers": 4,
        "n_evaders": 4,
        "max_cycles": 50,
        "n_catch": 2,
    },
    # butterfly/sisl families beyond MPE (the "marl-extra" install): library defaults, which are
    # the settings of the published references (cooperative_pong 900 cycles, KAZ 900 cycles and
    # 10 zombies, multiwalker 3 walkers / 500 cycles, pistonball 20 pistons / 125 cycles); the
    # observation preprocessing is in their tuned defaults (envs/conf/<name>.yaml, common.env_preprocess).
}

# Extra short names for variants of a registry env: short name -> (registry id, kwargs, what).
# PettingZoo 1.27 ships cooperative_pong v6 and knights_archers_zombies v11 (not v5/v10) and no
# waterworld (removed from sisl), so there is no waterworld short name.
_VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "knights_archers_zombies_image": (
        "butterfly/knights_archers_zombies-v11",
        {"obs_method": "image"},
        "PettingZoo butterfly/knights_archers_zombies-v11 with image observations (obs_method=image)",
    ),
}


def _mpe_infos() -> dict[str, MarlEnvInfo]:
    out: dict[str, MarlEnvInfo] = {}
    for mod in MPE2_MODULES:
        short = _VERSION_SUFFIX.sub("", mod)
        info = MarlEnvInfo(
            name=short,
            source="mpe2",
            target=mod,
            defaults=dict(_SHIPPED_DEFAULTS.get(mod, {})),
            description=f"mpe2 {mod} (Parallel API)",
        )
        out[short] = info
        out[mod] = info
    return out


def _pettingzoo_infos() -> dict[str, MarlEnvInfo]:
    import pettingzoo  # registry only: entry points are strings, nothing heavy is imported

    out: dict[str, MarlEnvInfo] = {}
    for env_id in pettingzoo.parallel_registry:
        namespace, _, rest = env_id.rpartition("/")
        base, _, version = rest.rpartition("-v")
        short = base
        info = MarlEnvInfo(
            name=short,
            source="pettingzoo",
            target=env_id,
            defaults=dict(_SHIPPED_DEFAULTS.get(env_id, {})),
            description=f"PettingZoo {env_id} (Parallel API)",
        )
        for key in (short, f"{base}_v{version}", env_id):
            # mpe2 names win over any legacy PettingZoo entry of the same name
            out.setdefault(key, info)
    return out


def _build_table() -> dict[str, MarlEnvInfo]:
    import pettingzoo

    table = _mpe_infos()
    for key, info in _pettingzoo_infos().items():
        table.setdefault(key, info)
    for short, (target, kwargs, what) in _VARIANTS.items():
        if target in pettingzoo.parallel_registry:
            table.setdefault(
                short,
                MarlEnvInfo(name=short, source="pettingzoo", target=target, defaults=dict(kwargs), description=what),
            )
    return table


class _LazyTable(dict):
    """The name table, filled on first use so that importing this module stays cheap."""

    _filled = False

    def _fill(self) -> None:
        if not self._filled:
            self._filled = True
            super().update(_build_table())

    def __getitem__(self, key: str) -> MarlEnvInfo:
        self._fill()
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._fill()
        return super().__contains__(key)

    def __iter__(self):  # type: ignore[no-untyped-def]
        self._fill()
        return super().__iter__()

    def __len__(self) -> int:
        self._fill()
        return super().__len__()

    def keys(self):  # type: ignore[no-untyped-def]
        self._fill()
        return super().keys()

    def items(self):  # type: ignore[no-untyped-def]
        self._fill()
        return super().items()

    def values(self):  # type: ignore[no-untyped-def]
        self._fill()
        return super().values()

    def get(self, key: str, default: Any = None) -> Any:
        self._fill()
        return super().get(key, default)


MARL_ENVS: dict[str, MarlEnvInfo] = _LazyTable()


def marl_env_names() -> list[str]:
    """Canonical short names (one per env, without version aliases), sorted."""
    return sorted({info.name for info in MARL_ENVS.values()})


def make_parallel_env(name: str, *, fast: bool = True, **kwargs: Any) -> Any:
    """Build a PettingZoo ``ParallelEnv`` from a short name, a versioned name or a registry id.

    ``kwargs`` override the shipped defaults (see ``MarlEnvInfo.defaults``). ``fast`` selects
    :class:`MPEParallelEnv` for mpe2 scenarios. ``pz:<id>`` forces PettingZoo's registry and falls
    back to the AEC registry + ``aec_to_parallel`` for AEC-only ids; ``pz:aec:<id>`` always builds
    the AEC env and converts it (useful to check an env's two APIs against each other).
    """
    if name.startswith("pz:aec:"):
        return _make_pettingzoo(name[len("pz:aec:") :], kwargs, force_aec=True)
    if name.startswith("pz:"):
        return _make_pettingzoo(name[3:], kwargs)
    if name not in MARL_ENVS:
        known = ", ".join(marl_env_names())
        raise KeyError(f"unknown multi-agent env {name!r}; known short names: {known}")
    info = MARL_ENVS[name]
    merged = {**info.defaults, **kwargs}
    if info.source == "mpe2":
        if fast:
            return MPEParallelEnv(info.target, **merged)
        module = importlib.import_module(f"mpe2.{info.target}")
        return module.parallel_env(**merged)
    return _make_pettingzoo(info.target, merged)


def _make_pettingzoo(env_id: str, kwargs: dict[str, Any], force_aec: bool = False) -> Any:
    import pettingzoo
    from pettingzoo.env_registry.exceptions import NameNotFound, NamespaceNotFound, VersionNotFound
    from pettingzoo.utils.conversions import aec_to_parallel

    if not force_aec:
        try:
            pettingzoo.spec("parallel", env_id)
        except (NameNotFound, NamespaceNotFound, VersionNotFound):
            force_aec = True
    if force_aec:
        # aec_to_parallel refuses envs whose metadata lacks is_parallelizable (turn-based games)
        return aec_to_parallel(pettingzoo.make("aec", env_id, **kwargs))
    return pettingzoo.make("parallel", env_id, **kwargs)


# --------------------------------------------------------------------------------------------
# mpe2 direct Parallel driver
# --------------------------------------------------------------------------------------------


def _parallel_env_base() -> type:
    from pettingzoo import ParallelEnv

    return ParallelEnv


@dataclass
class MPESnapshot:
    """Everything that determines an mpe2 env's future given the same actions.

    world: deep copy of ``raw_env.world`` (positions, velocities, comm states, goals);
    steps: the step counter that triggers truncation; rng_state: the bit-generator state of
    ``raw_env.np_random`` (used by resets and some scenarios); np_global_state: numpy's legacy
    global RNG, only captured when some agent has action noise (``World.step`` draws from it);
    agents / scenario_state: the live agent list and scenario attributes (e.g. curriculum stage).
    """

    world: Any
    steps: int
    rng_state: dict[str, Any]
    agents: list[str]
    scenario_state: dict[str, Any]
    np_global_state: dict[str, Any] | tuple[Any, ...] | None


class MPEParallelEnv(_parallel_env_base()):  # type: ignore[misc]
    """PettingZoo Parallel env over an mpe2 ``raw_env`` without the AEC round-robin.

    Observations, rewards, terminations and truncations equal those of
    ``mpe2.<module>.parallel_env`` for the same seed and actions (test_marl_envs checks it).
    Out-of-range discrete actions raise; continuous actions are clipped as mpe2's wrapper does.
    """

    def __init__(self, module: str, **kwargs: Any) -> None:
        mod = importlib.import_module(f"mpe2.{module}")
        self.raw = mod.raw_env(**kwargs)
        self.metadata = dict(self.raw.metadata)
        self.metadata["name"] = module
        self.possible_agents: list[str] = list(self.raw.possible_agents)
        self.agents: list[str] = []
        self.render_mode = self.raw.render_mode
        self._index = {a: i for i, a in enumerate(self.possible_agents)}
        self._continuous = bool(self.raw.continuous_actions)
        self.observation_spaces = {a: self.raw.observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: self.raw.action_space(a) for a in self.possible_agents}
        self.state_space = self.raw.state_space

    # -- Parallel API -------------------------------------------------------------------------
    def observation_space(self, agent: str) -> Any:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> Any:
        return self.action_spaces[agent]

    @property
    def unwrapped(self) -> Any:
        return self.raw

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        self.raw.reset(seed=seed, options=options)
        self.agents = list(self.raw.agents)
        obs = {a: self.raw.observe(a) for a in self.agents}
        return obs, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        raw = self.raw
        current = [None] * len(self.possible_agents)
        for agent in self.agents:
            act = actions[agent]
            space = self.action_spaces[agent]
            if self._continuous:
                act = np.clip(np.asarray(act, dtype=np.float32), space.low, space.high)
            elif not (0 <= int(act) < space.n):
                raise ValueError(f"action {act!r} of {agent} is outside {space}")
            current[self._index[agent]] = act
        raw.current_actions = current
        raw._execute_world_step()
        raw.steps += 1
        truncated = raw.steps >= raw.max_cycles
        terminated = (not truncated) and bool(raw.scenario.is_terminal(raw.world))
        live = self.agents
        obs = {a: raw.observe(a) for a in live}
        rewards = {a: float(raw.rewards[a]) for a in live}
        terms = {a: terminated for a in live}
        truncs = {a: truncated for a in live}
        infos = {a: dict(raw.infos.get(a, {})) for a in live}
        if truncated or terminated:
            self.agents = []
        if self.render_mode == "human":
            raw.render()
        return obs, rewards, terms, truncs, infos

    def state(self) -> np.ndarray:
        return self.raw.state()

    def render(self) -> Any:
        return self.raw.render()

    def close(self) -> None:
        self.raw.close()

    # -- snapshots ----------------------------------------------------------------------------
    def snapshot(self) -> MPESnapshot:
        """Capture world, step counter and RNG (``copy.deepcopy(env)`` would rebuild a fresh env)."""
        raw = self.raw
        noisy = any(getattr(a, "u_noise", None) or getattr(a, "c_noise", None) for a in raw.world.agents)
        scen = {k: copy.deepcopy(v) for k, v in vars(raw.scenario).items()}
        return MPESnapshot(
            world=copy.deepcopy(raw.world),
            steps=int(raw.steps),
            rng_state=copy.deepcopy(raw.np_random.bit_generator.state),
            agents=list(self.agents),
            scenario_state=scen,
            np_global_state=np.random.get_state() if noisy else None,
        )

    def restore(self, snap: MPESnapshot) -> None:
        """Put the env back in the snapshot's state; the snapshot stays reusable."""
        raw = self.raw
        raw.world = copy.deepcopy(snap.world)
        raw.steps = snap.steps
        raw.np_random.bit_generator.state = copy.deepcopy(snap.rng_state)
        for k, v in snap.scenario_state.items():
            setattr(raw.scenario, k, copy.deepcopy(v))
        if snap.np_global_state is not None:
            np.random.set_state(snap.np_global_state)
        self.agents = list(snap.agents)
        raw.agents = list(self.possible_agents)
        raw.rewards = {a: 0.0 for a in raw.agents}
        raw._cumulative_rewards = {a: 0.0 for a in raw.agents}
        raw.terminations = {a: False for a in raw.agents}
        raw.truncations = {a: False for a in raw.agents}
        raw.infos = {a: {} for a in raw.agents}
        raw.current_actions = [None] * len(raw.agents)
