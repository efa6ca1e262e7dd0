"""PettingZoo observation preprocessing with SuperSuit, the global state of image envs, and the
optional packages of the butterfly/sisl families.

``env_preprocess`` (config section; the shipped image envs set it in their tuned defaults,
``envs/multiagent.py``) is applied to every env the factory builds with SuperSuit's own wrappers
(not copies of them):

* ``color_reduction``: ``null`` | ``full`` (grayscale) | ``R`` | ``G`` | ``B`` -> ``color_reduction_v0``
* ``resize``: ``null`` | ``[width, height]`` -> ``resize_v1`` (bilinear)
* ``dtype``: ``null`` (image envs stay ``uint8``) | ``uint8`` | ``float32`` -> ``dtype_v0``
* ``frame_stack``: ``N`` last observations stacked on the channel axis (1 = off) -> ``frame_stack_v1``
  (a single grayscale frame gets its channel axis back with ``reshape_v0``)

The per-frame ones (the first three, and the reshape) go on the AEC env inside PettingZoo's
``aec_to_parallel`` and :class:`ParallelFromAEC` converts once; frame stacking follows on the
Parallel env (why, and what it saves: :func:`apply`).

``state_resize`` (``[width, height]``): envs whose ``env.state()`` is an image (the butterfly
screen) get it grayscaled and resized with SuperSuit's transforms, scaled to [0, 1] and flattened
(:class:`DownsampledState`), which is what MAPPO's centralized critic reads (why, in
:mod:`grpo_marl.policies.cnn`).

The families beyond MPE need packages outside the base install (pygame, pymunk, Box2D,
SuperSuit): :func:`missing_modules` names them and :func:`grpo_marl.tasks.check_extras` refuses
before anything is built, naming ``pip install -e ".[marl-extra]"``.

Snapshots: SuperSuit wrappers hold local closures and Box2D worlds cannot be pickled, so these
envs are wrapped last in :class:`ReplaySnapshots`, whose snapshot is the episode's reset seed and
the actions taken since; restoring resets with that seed and replays them (exact for envs that
are deterministic given the seed, which PettingZoo's are; the cost grows with the episode's
length). That is what PPO's exact-resume checkpoints and GRPO's state groups use.
"""

from __future__ import annotations

import functools
import importlib.util
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_marl.errors import UserInputError

EXTRA = "marl-extra"

#: ``env_preprocess`` defaults: nothing changes an env's observations unless asked.
PREPROCESS_DEFAULTS: dict[str, Any] = {
    "color_reduction": None,
    "resize": None,
    "frame_stack": 1,
    "dtype": None,
    "state_resize": [42, 42],
}

#: family (short name without version) -> modules its envs import (beyond pettingzoo itself).
FAMILY_MODULES: dict[str, tuple[str, ...]] = {
    "cooperative_pong": ("pygame", "supersuit"),
    "pistonball": ("pygame", "pymunk", "supersuit"),
    "knights_archers_zombies": ("pygame", "supersuit"),
    "knights_archers_zombies_image": ("pygame", "supersuit"),
    "multiwalker": ("pygame", "Box2D", "supersuit"),
    "waterworld": ("pygame", "pymunk", "supersuit"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # parent missing, or stubbed out with sys.modules[name] = None
        return False


def family_of(env_name: str) -> str:
    """``cooperative_pong_v6`` / ``butterfly/cooperative_pong-v6`` -> ``cooperative_pong``."""
    import re

    name = env_name.split(":", 1)[-1].rsplit("/", 1)[-1]
    return re.sub(r"(_v\d+|-v\d+)$", "", name)


def missing_modules(env_name: str, preprocess: Mapping[str, Any] | None = None) -> list[str]:
    """Modules the env (and non-default preprocessing) needs that are not installed."""
    needs = list(FAMILY_MODULES.get(family_of(env_name), ()))
    if preprocess and is_active(preprocess) and "supersuit" not in needs:
        needs.append("supersuit")
    return [m for m in needs if not _installed(m)]


def missing_extra_message(env_name: str, modules: list[str]) -> str:
    return (
        f"env {env_name!r} needs {', '.join(modules)}, which is not installed; install the {EXTRA!r} extra: "
        f'pip install -e ".[{EXTRA}]" (or pip install "grpo_marl[{EXTRA}]")'
    )


def settings_of(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``env_preprocess`` section with defaults filled, checked (one message naming the key)."""
    out = {**PREPROCESS_DEFAULTS, **dict(section or {})}
    unknown = sorted(set(out) - set(PREPROCESS_DEFAULTS))
    if unknown:
        raise UserInputError(f"env_preprocess has unknown keys {unknown}; known: {sorted(PREPROCESS_DEFAULTS)}")
    if out["color_reduction"] not in (None, "full", "R", "G", "B"):
        raise UserInputError(f"env_preprocess.color_reduction={out['color_reduction']!r}: choose null, full, R, G or B")
    for key in ("resize", "state_resize"):
        v = out[key]
        if v is not None and not (
            isinstance(v, list | tuple) and len(v) == 2 and all(isinstance(d, int) and d > 0 for d in v)
        ):
            raise UserInputError(f"env_preprocess.{key}={v!r}: write [width, height] (positive integers) or null")
    if not isinstance(out["frame_stack"], int) or out["frame_stack"] < 1:
        raise UserInputError(f"env_preprocess.frame_stack={out['frame_stack']!r}: an integer >= 1 (1 = off)")
    if out["dtype"] not in (None, "uint8", "float32"):
        raise UserInputError(f"env_preprocess.dtype={out['dtype']!r}: choose null, uint8 or float32")
    return out


def is_active(settings: Mapping[str, Any]) -> bool:
    """Whether the observation preprocessing changes anything."""
    s = {**PREPROCESS_DEFAULTS, **dict(settings)}
    return bool(s["color_reduction"] or s["resize"] or s["frame_stack"] > 1 or s["dtype"])


def _parallel_base() -> type:
    from pettingzoo.utils.wrappers import BaseParallelWrapper

    return BaseParallelWrapper


class DownsampledState(_parallel_base()):  # type: ignore[misc]
    """``env.state()`` (an RGB screen) -> grayscale, resized to ``width x height`` with SuperSuit's
    transforms, scaled to [0, 1], flat ``float32[height * width]``."""

    def __init__(self, env: Any, width: int, height: int) -> None:
        from gymnasium import spaces

        super().__init__(env)
        self.size = (int(width), int(height))
        self.state_space = spaces.Box(0.0, 1.0, (self.size[0] * self.size[1],), np.float32)
        self._gray_space = spaces.Box(0, 255, (self.size[1], self.size[0]), np.uint8)

    def state(self) -> np.ndarray:
        from supersuit.utils.basic_transforms import color_reduction, resize

        screen = np.asarray(self.env.state())
        gray = color_reduction.change_observation(screen, None, "full") if screen.ndim == 3 else screen
        small = resize.change_observation(gray, self._gray_space, (self.size[0], self.size[1], True))
        return np.asarray(small, dtype=np.float32).reshape(-1) / 255.0


@dataclass
class ReplaySnapshot:
    """An episode's reset arguments and every joint action since (see the module docstring)."""

    seed: int | None
    options: dict[str, Any] | None
    actions: list[dict[str, Any]]


class ReplaySnapshots(_parallel_base()):  # type: ignore[misc]
    """Outermost wrapper: records the reset seed and the actions, restores by replaying them."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self._seed: int | None = None
        self._options: dict[str, Any] | None = None
        self._actions: list[dict[str, Any]] = []

    @property
    def agents(self) -> list[str]:
        return self.env.agents

    @property
    def possible_agents(self) -> list[str]:
        return self.env.possible_agents

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self._seed, self._options, self._actions = seed, options, []
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> Any:
        self._actions.append({a: np.array(v) if isinstance(v, np.ndarray) else v for a, v in actions.items()})
        return self.env.step(actions)

    def state(self) -> np.ndarray:
        """``env.state()``; at an episode's end, where multiwalker's raises (its walkers are
        destroyed), the last state it gave."""
        try:
            self._last_state = np.asarray(self.env.state())
        except Exception:
            if self.env.agents or getattr(self, "_last_state", None) is None:
                raise
        return self._last_state

    def snapshot(self) -> ReplaySnapshot:
        return ReplaySnapshot(self._seed, self._options, list(self._actions))

    def restore(self, snap: ReplaySnapshot) -> None:
        self.env.reset(seed=snap.seed, options=snap.options)
        for act in snap.actions:
            self.env.step(act)
        self._seed, self._options, self._actions = snap.seed, snap.options, list(snap.actions)


def _is_image(space: Any) -> bool:
    from grpo_marl.vec.spaces import is_image_space

    return is_image_space(space)


def apply(env: Any, settings: Mapping[str, Any], name: str = "env") -> Any:
    """Wrap a PettingZoo Parallel env with the configured SuperSuit preprocessing.

        SuperSuit's per-frame wrappers (color reduction, resize, dtype, reshape) exist only in AEC
        form; applied to a Parallel env, each one converts it to AEC and back, and every
        ``aec_to_parallel`` layer observes each agent once more per step (the observation it reads
        before every agent's action and discards). On cooperative_pong that rendered and resized the
        280x480 screen many times per step. So when ``env`` is itself an ``aec_to_parallel`` of an
        AEC env (every butterfly/sisl env built from PettingZoo's registry), the per-frame wrappers go
        on that AEC env, stateless, and :class:`ParallelFromAEC` converts once; frame stacking, which
        keeps state, stays at the Parallel level (SuperSuit's Parallel wrapper), so every agent's
        stack holds the frames after each joint step: the observations are those of wrapping the
        Parallel env (``tests/test_image_envs.py``) in about 0.5-0.6 of the time per step
    (``python -m benchmarks.marl_extra speed``)."""
    s = settings_of(settings)
    agent = env.possible_agents[0]
    space = env.observation_space(agent)
    image = _is_image(space) or (
        len(getattr(space, "shape", ()) or ()) == 3 and getattr(space, "dtype", None) == np.uint8
    )
    aec = _aec_inside(env)
    if aec is not None:
        env = aec
    if is_active(s):
        import supersuit as ss

        if (s["color_reduction"] or s["resize"]) and not image:
            raise UserInputError(
                f"env_preprocess.color_reduction/resize need image observations; env {name!r} observes {space}: "
                "set them to null"
            )
        shape = tuple(space.shape)
        if s["color_reduction"]:
            if shape[-1] != 3:
                raise UserInputError(
                    f"env_preprocess.color_reduction needs RGB observations; env {name!r} has shape {shape}"
                )
            env = ss.color_reduction_v0(env, s["color_reduction"])
        if s["resize"]:
            env = ss.resize_v1(env, int(s["resize"][0]), int(s["resize"][1]), linear_interp=True)
        if image or s["dtype"] == "uint8":
            # resize_v1 hands out floats; images go back to uint8 (what the vector env keeps)
            env = ss.dtype_v0(env, np.uint8 if s["dtype"] in (None, "uint8") else np.float32)
        elif s["dtype"]:
            env = ss.dtype_v0(env, np.dtype(s["dtype"]).type)
        frame_shape = tuple(env.observation_space(agent).shape)
        if image and len(frame_shape) == 2 and s["frame_stack"] == 1:
            # a single grayscale frame gets its channel axis back (stacking adds one itself)
            env = ss.reshape_v0(env, (*frame_shape, 1))
    if aec is not None:
        env = ParallelFromAEC(env)
    if is_active(s) and s["frame_stack"] > 1:
        import supersuit as ss

        env = ss.frame_stack_v1(env, int(s["frame_stack"]))
    state_space = getattr(env, "state_space", None)
    if (
        s["state_resize"]
        and state_space is not None
        and len(getattr(state_space, "shape", ()) or ()) == 3
        and getattr(state_space, "dtype", None) == np.uint8
    ):
        env = DownsampledState(env, int(s["state_resize"][0]), int(s["state_resize"][1]))
    _expose_cycle_limit(env)
    return ReplaySnapshots(env)


def _aec_inside(env: Any) -> Any:
    """The AEC env of a plain ``aec_to_parallel`` conversion, else None."""
    from pettingzoo.utils.conversions import aec_to_parallel_wrapper

    return env.aec_env if type(env) in (aec_to_parallel_wrapper, ParallelFromAEC) else None


def _converter_base() -> type:
    from pettingzoo.utils.conversions import aec_to_parallel_wrapper

    return aec_to_parallel_wrapper


class ParallelFromAEC(_converter_base()):  # type: ignore[misc]
    """PettingZoo's ``aec_to_parallel`` minus one discarded observation per agent and step.

    Its ``step`` calls ``aec_env.last()`` before each agent's action and drops the observation
    that call computes; for envs that render their observations (and for every per-frame
    SuperSuit wrapper on them) that is a full extra render + preprocess per agent. Everything
    else (the cycle checks, reward accumulation, dead-agent stepping, the returned dicts) is
    PettingZoo's."""

    def step(self, actions: dict[str, Any]) -> Any:
        aec = self.aec_env
        rewards: dict[str, float] = defaultdict(int)
        for agent in aec.agents:
            if agent != aec.agent_selection:
                if aec.terminations[agent] or aec.truncations[agent]:
                    raise AssertionError(
                        f"expected agent {agent} got termination or truncation agent {aec.agent_selection}: "
                        "the Parallel API needs every agent's end at the end of a cycle"
                    )
                raise AssertionError(
                    f"expected agent {agent} got agent {aec.agent_selection}: agents must step in a cycle"
                )
            aec.step(actions[agent])
            # one lookup each through the wrapper stack (pistonball: 20 agents x 20 rewards a step)
            step_rewards = aec.rewards
            for other in aec.agents:
                rewards[other] += step_rewards[other]
        terminations = dict(**aec.terminations)
        truncations = dict(**aec.truncations)
        infos = dict(**aec.infos)
        observations = {agent: aec.observe(agent) for agent in aec.agents}
        while aec.agents and (aec.terminations[aec.agent_selection] or aec.truncations[aec.agent_selection]):
            aec.step(None)
        self.agents = aec.agents
        return observations, rewards, terminations, truncations, infos


def _expose_cycle_limit(env: Any) -> None:
    """butterfly/sisl raw envs keep ``max_cycles`` on their inner game object; the driver reads it
    from ``env.unwrapped`` (it bounds rollout storage), so copy it up when it is only there."""
    raw = env.unwrapped
    if not isinstance(vars(raw).get("max_cycles"), int):
        inner = vars(raw).get("env")
        limit = getattr(inner, "max_cycles", None)
        if isinstance(limit, int):
            raw.max_cycles = limit


def wrap_factory(factory: Callable[..., Any], settings: Mapping[str, Any], name: str) -> Callable[..., Any]:
    """``factory(**kwargs)`` followed by :func:`apply` (picklable for worker processes)."""
    return functools.partial(_build, factory, dict(settings), name)


def _build(factory: Callable[..., Any], settings: dict[str, Any], name: str, **kwargs: Any) -> Any:
    import warnings

    # butterfly envs render their observation frames themselves and warn that no render_mode was set
    warnings.filterwarnings("ignore", message=".*without specifying any render mode.*")
    env = factory(**kwargs)
    from pettingzoo import AECEnv

    if isinstance(env, AECEnv):
        env = ParallelFromAEC(env)
    return apply(env, settings, name)
