"""Vectorized single-agent environments with one contract for every collector.

Collectors need four things Gymnasium's vector envs do not agree on: per-env reset seeds (the
native ``CartPoleVectorEnv`` takes one int), the same autoreset semantics (native envs reset on
the *next* step, Sync/Async can reset in the *same* step), the final observation of a finished
episode (for bootstrapping truncations), and copying one env's state into others (seed and state
groups). :class:`VecEnv` gives exactly that, with ``SAME_STEP`` semantics: the observation
returned for a finished env is already the first one of its next episode and the last real
observation is in ``final_obs``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import gymnasium as gym
import numpy as np

from grpo_marl.snapshot import restore_env, snapshot_env


class VecStep(NamedTuple):
    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray | None  # rows valid where terminated | truncated


class VecEnv:
    """Common interface; see the module docstring for the semantics."""

    num_envs: int
    single_observation_space: gym.Space
    single_action_space: gym.Space
    max_episode_steps: int | None
    supports_snapshot: bool = False

    def reset(self, seeds: Sequence[int]) -> np.ndarray:
        """Reset every env; envs given the same seed start from the same state."""
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> VecStep:
        raise NotImplementedError

    def snapshot(self, index: int) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} cannot snapshot envs; use vectorization=sync (or native) for "
            "group_mode=state"
        )

    def restore(self, indices: Sequence[int], snapshot: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} cannot restore envs; use vectorization=sync (or native)"
        )

    def reset_one(self, index: int, seed: int) -> np.ndarray:
        """Reset env ``index`` alone to an initial state drawn from ``seed`` (the same seed gives
        the same state) and return its first observation."""
        raise NotImplementedError(f"{type(self).__name__} cannot reset one env alone")

    def get_state(self) -> Any:
        """Everything that determines every env's future (for exact resume of a collector whose
        episodes carry over between updates)."""
        return [self.snapshot(i) for i in range(self.num_envs)]

    def set_state(self, state: Any) -> None:
        for i, snap in enumerate(state):
            self.restore([i], snap)

    def close(self) -> None:
        pass


class NativeCartPoleVecEnv(VecEnv):
    """Gymnasium's numpy ``CartPoleVectorEnv`` with per-env seeds, SAME_STEP resets and snapshots.

    Its state is a ``(4, N)`` array plus a step counter per env, so copying a column is an exact
    snapshot (the dynamics are deterministic; the RNG only draws new initial states).
    """

    supports_snapshot = True

    def __init__(self, num_envs: int, **kwargs: Any) -> None:
        from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

        self.env = CartPoleVectorEnv(num_envs=num_envs, **kwargs)
        self.num_envs = num_envs
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space
        self.max_episode_steps = int(self.env.max_episode_steps)

    def reset(self, seeds: Sequence[int]) -> np.ndarray:
        seeds = np.asarray(seeds, dtype=np.int64)
        self.env.reset(seed=int(seeds[0]))
        # One int seeds the whole native env; envs sharing a seed copy their leader's state, and
        # each distinct seed's leader draws its own state from the env RNG.
        _, leader, inverse = np.unique(seeds, return_index=True, return_inverse=True)
        self.env.state = np.ascontiguousarray(self.env.state[:, leader[inverse]])
        return self.env.state.T.astype(np.float32)

    def step(self, actions: np.ndarray) -> VecStep:
        env = self.env
        env.prev_done[:] = False  # we reset finished envs ourselves, in the same step
        obs, reward, terminated, truncated, _ = env.step(actions)
        done = terminated | truncated
        final_obs = None
        if done.any():
            final_obs = obs.copy()
            n = int(done.sum())
            env.state[:, done] = env.np_random.uniform(low=env.low, high=env.high, size=(4, n))
            env.steps[done] = 0
            obs = env.state.T.astype(np.float32)
        return VecStep(obs, reward, terminated, truncated, final_obs)

    def snapshot(self, index: int) -> Any:
        return (self.env.state[:, index].copy(), int(self.env.steps[index]))

    def restore(self, indices: Sequence[int], snapshot: Any) -> None:
        state, steps = snapshot
        idx = np.asarray(indices)
        self.env.state[:, idx] = state[:, None]
        self.env.steps[idx] = steps

    def reset_one(self, index: int, seed: int) -> np.ndarray:
        env = self.env
        env.state[:, index] = np.random.default_rng(int(seed)).uniform(low=env.low, high=env.high, size=4)
        env.steps[index] = 0
        return env.state[:, index].astype(np.float32)

    def get_state(self) -> Any:
        # The shared RNG draws the initial state of every automatic reset.
        return (self.env.state.copy(), self.env.steps.copy(), self.env.np_random.bit_generator.state)

    def set_state(self, state: Any) -> None:
        env_state, steps, rng = state
        self.env.state = env_state.copy()
        self.env.steps[:] = steps
        self.env.np_random.bit_generator.state = rng

    def observations(self, indices: Sequence[int]) -> np.ndarray:
        return self.env.state[:, np.asarray(indices)].T.astype(np.float32)


class EnvWorkerError(RuntimeError):
    """An env raised inside its worker process (async vectorization). The message names the env,
    the vector index and the reset seed of the episode, so the failure can be replayed alone;
    training stops and the last checkpoint is kept."""


def _mp_context() -> str | None:
    """Start method of async env workers: ``GRPO_MARL_MP_CONTEXT`` if set; ``spawn`` once CUDA is
    initialised in this process (forking a CUDA/NCCL process is unsafe); else the default."""
    import os
    import sys

    ctx = os.environ.get("GRPO_MARL_MP_CONTEXT")
    if ctx:
        return ctx
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "spawn"
    return None


class GymVecEnv(VecEnv):
    """Gymnasium ``SyncVectorEnv``/``AsyncVectorEnv`` in SAME_STEP autoreset mode.

    With ``asynchronous=True`` every env steps in its own process (for envs whose step costs more
    than the IPC, while the policy runs batched on the GPU). An exception in a worker is re-raised
    as :class:`EnvWorkerError` naming ``name``, the env's index and its episode's reset seed.
    """

    def __init__(
        self, env_fns: Sequence[Callable[[], gym.Env]], asynchronous: bool = False, name: str = "env"
    ) -> None:
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

        self.name = name
        self.asynchronous = asynchronous
        if asynchronous:
            self.env = AsyncVectorEnv(list(env_fns), autoreset_mode=AutoresetMode.SAME_STEP, context=_mp_context())
        else:
            self.env = SyncVectorEnv(list(env_fns), autoreset_mode=AutoresetMode.SAME_STEP)
        self.num_envs = self.env.num_envs
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space
        self.supports_snapshot = not asynchronous
        spec = self.env.spec if getattr(self.env, "spec", None) else None
        self.max_episode_steps = getattr(spec, "max_episode_steps", None) if spec else None
        if self.max_episode_steps is None:
            # Async workers own the envs: ask worker 0 for its spec (one IPC round, at start).
            first = self.env.envs[0].spec if not asynchronous else self.env.get_attr("spec")[0]
            self.max_episode_steps = getattr(first, "max_episode_steps", None)
        # Reset seed of each env's current run of episodes and the auto-resets since, for errors.
        self._seeds = np.full(self.num_envs, -1, dtype=np.int64)
        self._autoresets = np.zeros(self.num_envs, dtype=np.int64)

    def _worker_error(self, exc: Exception, during: str) -> EnvWorkerError:
        failed = [i for i, pipe in enumerate(getattr(self.env, "parent_pipes", [])) if pipe is None]
        where = []
        for i in failed or range(self.num_envs):
            seed = int(self._seeds[i])
            desc = f"vector index {i}, reset seed {seed if seed >= 0 else 'none'}"
            if self._autoresets[i]:
                desc += f" + {int(self._autoresets[i])} automatic reset(s) without a seed"
            where.append(desc)
            if not failed and len(where) >= 4:
                where.append("...")
                break
        return EnvWorkerError(
            f"env {self.name!r} raised in its worker process during {during} "
            f"({'; '.join(where)}): {type(exc).__name__}: {exc}"
        )

    def reset(self, seeds: Sequence[int]) -> np.ndarray:
        seeds = [int(s) for s in seeds]
        self._seeds[:] = seeds
        self._autoresets[:] = 0
        try:
            obs, _ = self.env.reset(seed=seeds)
        except Exception as exc:
            if not self.asynchronous:
                raise
            raise self._worker_error(exc, "reset") from exc
        return obs

    def step(self, actions: np.ndarray) -> VecStep:
        try:
            obs, reward, terminated, truncated, info = self.env.step(actions)
        except Exception as exc:
            if not self.asynchronous:
                raise
            raise self._worker_error(exc, "step") from exc
        final_obs = None
        done = terminated | truncated
        self._autoresets += done
        if done.any():
            final_obs = obs.copy()
            finals = info.get("final_obs")
            if finals is not None:
                for i in np.flatnonzero(done):
                    final_obs[i] = finals[i]
        return VecStep(obs, reward.astype(np.float32), terminated, truncated, final_obs)

    def snapshot(self, index: int) -> Any:
        if not self.supports_snapshot:
            return super().snapshot(index)
        return snapshot_env(self.env.envs[index])

    def restore(self, indices: Sequence[int], snapshot: Any) -> None:
        if not self.supports_snapshot:
            return super().restore(indices, snapshot)
        for i in indices:
            restore_env(self.env.envs[int(i)], snapshot)
            # SAME_STEP bookkeeping: a restored env is mid-episode, not awaiting a reset.
            self.env._autoreset_envs[int(i)] = False

    def reset_one(self, index: int, seed: int) -> np.ndarray:
        if self.asynchronous:
            return super().reset_one(index, seed)
        obs, _ = self.env.envs[int(index)].reset(seed=int(seed))
        self.env._autoreset_envs[int(index)] = False
        self._seeds[int(index)], self._autoresets[int(index)] = int(seed), 0
        return obs

    def close(self) -> None:
        self.env.close()


def make_vec_env(
    spec: Any, num_envs: int, env_kwargs: dict[str, Any] | None = None, vectorization: str = "auto"
) -> VecEnv:
    """Build a :class:`VecEnv` for a registered gymnasium-kind spec.

    ``vectorization``: ``native`` (Gymnasium's numpy vector env, CartPole), ``sync`` (one process),
    ``async`` (one process per env: for envs whose step costs more than the IPC), or ``auto``
    (native where available, else sync).
    """
    env_kwargs = dict(env_kwargs or {})
    if vectorization not in ("auto", "native", "sync", "async"):
        raise ValueError(f"vectorization must be auto|native|sync|async, got {vectorization!r}")
    native_ok = spec.gym_id in ("CartPole-v1", "CartPole-v0") and not env_kwargs.get("render_mode")
    if vectorization == "native" and not native_ok:
        raise ValueError(f"env {spec.name!r} has no native vector implementation; use sync or async")
    if vectorization in ("auto", "native") and native_ok:
        max_steps = 200 if spec.gym_id == "CartPole-v0" else 500
        return NativeCartPoleVecEnv(num_envs, max_episode_steps=max_steps, **env_kwargs)

    def make_one() -> gym.Env:
        return spec.make(**env_kwargs)

    return GymVecEnv([make_one] * num_envs, asynchronous=vectorization == "async", name=spec.name)
