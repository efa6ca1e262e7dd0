"""Streaming seed-group collector: no vector slot waits for its group's longest episode.

The batch collector (:class:`grpo_marl.rollout.EpisodeCollector`) starts all ``num_groups x G``
episodes together and returns when the longest has ended, so a slot whose episode ended early
steps a finished env until then; on CartPole that idle share is 30-70% of the simulated steps.
Here every slot that finishes starts the next episode at once:

* a group is born when a slot resets with a fresh seed from the collector's RNG: the slot is its
  member 0 and a snapshot of that state is kept for the other ``G - 1`` members;
* the next slots to finish restore that snapshot and run members 1..G-1 (first in, first out),
  so all members of a group start from the identical state, as in seed groups;
* a group whose ``G`` episodes have all ended is complete; :meth:`collect` returns the oldest
  ``num_groups`` complete groups as soon as there are that many, and episodes still running
  carry over to the next call.

Carried-over episodes mix steps from the previous policy: their stored log-probs are those of
the policy that acted, so the clipped surrogate's ratio is the right importance weight. It needs
env snapshots (native or sync vectorization) and ``group_mode=seed``.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from grpo_marl.batch import Batch
from grpo_marl.policies.mlp import MLPPolicy
from grpo_marl.rollout import HostToDevice, NonFiniteError
from grpo_marl.vector import VecEnv


@dataclass
class _Group:
    snapshot: Any  # env state every member starts from (None once all members started)
    obs0: np.ndarray | None
    started: int  # members handed to a slot so far
    episodes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray] | None] = field(default_factory=list)
    ended: int = 0


class StreamingEpisodeCollector:
    """Collects ``num_groups`` complete seed groups per call; see the module docstring."""

    def __init__(
        self,
        vec: VecEnv,
        num_groups: int,
        group_size: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        max_steps: int | None = None,
        env_name: str = "env",
    ) -> None:
        if vec.num_envs != num_groups * group_size:
            raise ValueError(f"vector env has {vec.num_envs} envs, need num_groups*group_size")
        if not vec.supports_snapshot:
            raise ValueError(
                f"algo.rollout=stream starts group members from a snapshot, which {type(vec).__name__} "
                "cannot take; set vec.vectorization=sync (or native), or algo.rollout=batch"
            )
        cap = vec.max_episode_steps
        if cap is None:
            raise ValueError(
                "algo.rollout=stream runs every episode to the env's own end, and this env has no "
                "max_episode_steps; register it with a TimeLimit or use algo.rollout=batch"
            )
        if max_steps is not None and int(max_steps) != int(cap):
            raise ValueError(
                f"algo.rollout=stream runs every episode to the env's own limit ({cap} steps); "
                f"vec.max_steps={max_steps} cannot cut them: drop it or use algo.rollout=batch"
            )
        self.vec = vec
        self.num_groups = num_groups
        self.group_size = group_size
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        self.env_name = env_name
        self.max_steps = int(cap)
        self.total_env_steps = 0
        self._to_device = HostToDevice(self.device)
        self._started = False
        # Per-slot state of the episode in flight.
        self._obs: np.ndarray | None = None
        self._cursor = np.zeros(vec.num_envs, dtype=np.int64)
        self._slot_group = np.zeros(vec.num_envs, dtype=np.int64)
        self._slot_member = np.zeros(vec.num_envs, dtype=np.int64)
        self._buf: dict[str, Any] | None = None
        # Groups by id; members waiting for a slot (FIFO of group ids); complete groups in order.
        self._groups: dict[int, _Group] = {}
        self._waiting: deque[int] = deque()
        self._ready: deque[int] = deque()
        self._next_gid = 0

    # -- storage ---------------------------------------------------------------------------
    def _alloc(self, policy: MLPPolicy) -> dict[str, Any]:
        if self._buf is None:
            n, t = self.vec.num_envs, self.max_steps
            obs_shape = self.vec.single_observation_space.shape
            act_dtype = torch.long if policy.kind == "categorical" else torch.float32
            self._buf = {
                "obs": torch.zeros((n, t, *obs_shape), dtype=torch.float32, device=self.device),
                "actions": torch.zeros((n, t, *policy.action_shape()), dtype=act_dtype, device=self.device),
                "logp": torch.zeros((n, t), dtype=torch.float32, device=self.device),
                "rewards": np.zeros((n, t), dtype=np.float32),
            }
        return self._buf

    def _new_group(self, snapshot: Any, obs0: np.ndarray | None, started: int) -> int:
        gid = self._next_gid
        self._next_gid += 1
        self._groups[gid] = _Group(snapshot, obs0, started, [None] * self.group_size)
        return gid

    def _start(self) -> None:
        """First call: every slot starts, members of a group reset with one seed."""
        g = self.group_size
        seeds = self.rng.integers(0, 2**31 - 1, size=self.num_groups)
        self._obs = self.vec.reset(np.repeat(seeds, g))
        for k in range(self.num_groups):
            gid = self._new_group(None, None, g)
            self._slot_group[k * g:(k + 1) * g] = gid
            self._slot_member[k * g:(k + 1) * g] = np.arange(g)
        self._cursor[:] = 0
        self._started = True

    def _finish(self, i: int, obs: np.ndarray) -> None:
        """Slot ``i``'s episode ended: file it under its group, then give the slot new work."""
        buf, length = self._buf, int(self._cursor[i])
        assert buf is not None
        group = self._groups[int(self._slot_group[i])]
        group.episodes[int(self._slot_member[i])] = (
            buf["obs"][i, :length].clone(),
            buf["actions"][i, :length].clone(),
            buf["logp"][i, :length].clone(),
            buf["rewards"][i, :length].copy(),
        )
        group.ended += 1
        if group.ended == self.group_size:
            self._ready.append(int(self._slot_group[i]))
        self._cursor[i] = 0
        if self._waiting:
            gid = self._waiting[0]
            waiting = self._groups[gid]
            self.vec.restore([i], waiting.snapshot)
            obs[i] = waiting.obs0
            self._slot_group[i], self._slot_member[i] = gid, waiting.started
            waiting.started += 1
            if waiting.started == self.group_size:
                self._waiting.popleft()
                waiting.snapshot, waiting.obs0 = None, None
        else:
            # A fresh seed founds a group (not the env's own automatic reset: envs that were
            # restored from one snapshot share an RNG and would draw the same "new" state).
            obs[i] = self.vec.reset_one(i, int(self.rng.integers(0, 2**31 - 1)))
            gid = self._new_group(self.vec.snapshot(i), obs[i].copy(), 1)
            self._slot_group[i], self._slot_member[i] = gid, 0
            self._waiting.append(gid)

    # -- collection ------------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, policy: MLPPolicy) -> Batch:
        t0 = time.perf_counter()
        buf = self._alloc(policy)
        if not self._started:
            self._start()
        obs = self._obs
        assert obs is not None
        n = self.vec.num_envs
        slots = torch.arange(n, device=self.device)
        rows = np.arange(n)
        t = 0
        while len(self._ready) < self.num_groups:
            if not np.isfinite(obs).all():
                bad = np.flatnonzero(~np.isfinite(obs).all(axis=tuple(range(1, obs.ndim))))
                raise NonFiniteError(
                    f"non-finite observation from env {self.env_name!r} (vector indices {bad.tolist()})"
                )
            obs_t = self._to_device(obs)
            action, logp = policy.act(obs_t)
            cur = torch.as_tensor(self._cursor, device=self.device)
            buf["obs"][slots, cur] = obs_t
            buf["actions"][slots, cur] = action
            buf["logp"][slots, cur] = logp
            out = self.vec.step(policy.to_env(action))
            if not np.isfinite(out.reward).all():
                raise NonFiniteError(f"non-finite reward from env {self.env_name!r}")
            buf["rewards"][rows, self._cursor] = out.reward
            self._cursor += 1
            obs = out.obs
            t += 1
            done = out.terminated | out.truncated
            if done.any():
                obs = obs.copy()
                for i in np.flatnonzero(done):
                    self._finish(int(i), obs)
        self._obs = obs
        self.total_env_steps += t * n
        return self._assemble(t, n, time.perf_counter() - t0)

    def _assemble(self, t: int, n: int, seconds: float) -> Batch:
        episodes = []
        for _ in range(self.num_groups):
            gid = self._ready.popleft()
            episodes.extend(self._groups.pop(gid).episodes)
        obs = pad_sequence([e[0] for e in episodes], batch_first=True)
        actions = pad_sequence([e[1] for e in episodes], batch_first=True)
        logp = pad_sequence([e[2] for e in episodes], batch_first=True)
        lengths = torch.tensor([len(e[3]) for e in episodes], device=self.device)
        rewards = pad_sequence([torch.from_numpy(e[3]) for e in episodes], batch_first=True).to(self.device)
        mask = torch.arange(obs.shape[1], device=self.device)[None, :] < lengths[:, None]
        returns = rewards.sum(1)
        metrics = {
            "rollout/steps": float(t * n),
            "rollout/length_mean": float(lengths.float().mean()),
            "rollout/vector_utilization": 1.0,
            "rollout/rollout_return_mean": float(returns.mean()),
            "rollout/return_mean": float(returns.mean()),
            "rollout/return_std": float(returns.std(unbiased=False)),
            "rollout/return_min": float(returns.min()),
            "rollout/return_max": float(returns.max()),
            "rollout/groups_in_flight": float(len(self._groups)),
            "time/collect_s": seconds,
        }
        data = {"obs": obs, "actions": actions, "logp": logp, "rewards": rewards, "mask": mask}
        return Batch(data, group_size=self.group_size, metrics=metrics)

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "total_env_steps": self.total_env_steps,
            "started": self._started,
            "vec": self.vec.get_state() if self._started else None,
            "obs": None if self._obs is None else self._obs.copy(),
            "cursor": self._cursor.copy(),
            "slot_group": self._slot_group.copy(),
            "slot_member": self._slot_member.copy(),
            "buf": None if self._buf is None else {k: (v.clone() if torch.is_tensor(v) else v.copy())
                                                   for k, v in self._buf.items()},
            "groups": copy.deepcopy(self._groups),
            "waiting": list(self._waiting),
            "ready": list(self._ready),
            "next_gid": self._next_gid,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.total_env_steps = state["total_env_steps"]
        self._started = state["started"]
        if state["vec"] is not None:
            self.vec.set_state(state["vec"])
        self._obs = state["obs"]
        self._cursor = state["cursor"].copy()
        self._slot_group = state["slot_group"].copy()
        self._slot_member = state["slot_member"].copy()
        self._buf = None if state["buf"] is None else {
            k: (v.to(self.device) if torch.is_tensor(v) else v.copy()) for k, v in state["buf"].items()
        }
        self._groups = copy.deepcopy(state["groups"])
        self._waiting = deque(state["waiting"])
        self._ready = deque(state["ready"])
        self._next_gid = state["next_gid"]
