"""Streaming seed groups (``algo.rollout=stream``): no vector slot waits for its group's longest
episode.

The episode collector starts all ``num_groups x G`` episodes together and returns when the
longest has ended, so a slot whose episode ended early idles until then (30-70% of CartPole's
slots). Here every slot that finishes starts the next episode at once:

* a group is born when a slot resets with a fresh seed from the collector's RNG: the slot is its
  member 0 and a snapshot of that state is kept for the other ``G - 1`` members;
* the next slots to finish restore that snapshot and run members 1..G-1 (first in, first out),
  so all members of a group start from the identical state, as in seed groups;
* a group whose ``G`` episodes have all ended is complete; :meth:`collect` returns the oldest
  ``num_groups`` complete groups as soon as there are that many, and episodes still running carry
  over to the next call.

Carried-over episodes mix steps from the previous policy: their stored log-probs are those of the
policy that acted, so the clipped surrogate's ratio is the right importance weight. It needs env
snapshots and ``group_mode=seed``.
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
from grpo_marl.collectors.base import Collector, episode_metrics
from grpo_marl.errors import UserInputError
from grpo_marl.groups import AgentGroups, arrange_groups
from grpo_marl.policies.base import Policy
from grpo_marl.vec.base import Step, VecEnv


@dataclass
class _Group:
    snapshot: Any  # env state every member starts from (None once all members started)
    first: Step | None  # the step record of that state
    started: int  # members handed to a slot so far
    episodes: list[tuple[Any, ...] | None] = field(default_factory=list)
    ended: int = 0


class StreamingCollector(Collector):
    """Collects ``num_groups`` complete seed groups per call; see the module docstring."""

    def __init__(
        self,
        vec: VecEnv,
        groups: AgentGroups,
        num_groups: int,
        group_size: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        max_steps: int | None = None,
        env_name: str = "env",
    ) -> None:
        super().__init__(vec, device, seed, env_name)
        if vec.num_envs != num_groups * group_size:
            raise UserInputError(
                f"the vector env has {vec.num_envs} envs but algo.num_groups * algo.group_size = {num_groups * group_size}"
            )
        if not vec.supports_snapshot:
            vec.snapshot([0])  # raises SnapshotUnsupported naming what to change
        cap = vec.max_episode_steps
        if cap is None:
            raise UserInputError(
                f"algo.rollout=stream runs every episode to the env's own end, and env {env_name!r} has no "
                "episode limit; wrap it in a TimeLimit or use algo.rollout=batch"
            )
        if max_steps is not None and int(max_steps) != int(cap):
            raise UserInputError(
                f"algo.rollout=stream runs every episode to the env's own limit ({cap} steps); "
                f"vec.max_steps={max_steps} cannot cut them: drop it or use algo.rollout=batch"
            )
        self.groups = groups
        self.num_groups = num_groups
        self.group_size = group_size
        self.max_steps = int(cap)
        self._started = False
        self._step: Step | None = None
        n = vec.num_envs
        self._cursor = np.zeros(n, dtype=np.int64)
        self._slot_group = np.zeros(n, dtype=np.int64)
        self._slot_member = np.zeros(n, dtype=np.int64)
        self._buf: dict[str, Any] | None = None
        self._groups: dict[int, _Group] = {}
        self._waiting: deque[int] = deque()
        self._ready: deque[int] = deque()
        self._next_gid = 0
        self.member_ids = torch.as_tensor(arrange_groups("seed", num_groups, group_size, groups))

    def _alloc(self, policy: Policy) -> dict[str, Any]:
        if self._buf is None:
            n, t, a = self.vec.num_envs, self.max_steps, self.vec.layout.num_agents
            lay, dev = self.vec.layout, self.device
            self._buf = {
                "obs": torch.zeros((n, t, a, *lay.obs_shape), dtype=lay.obs_torch_dtype, device=dev),
                "actions": torch.zeros(
                    (n, t, a, *policy.action_shape()), dtype=policy.action_dtype, device=self.device
                ),
                "logp": torch.zeros((n, t, a), dtype=torch.float32, device=self.device),
                "rewards": torch.zeros((n, t, a), dtype=torch.float32, device=dev),
                "alive": torch.zeros((n, t, a), dtype=torch.bool, device=dev),
            }
            if lay.has_action_mask:
                self._buf["action_mask"] = torch.zeros((n, t, a, lay.max_actions), dtype=torch.bool, device=dev)
        return self._buf

    def _new_group(self, snapshot: Any, first: Step | None, started: int) -> int:
        gid = self._next_gid
        self._next_gid += 1
        self._groups[gid] = _Group(snapshot, first, started, [None] * self.group_size)
        return gid

    def _start(self) -> None:
        g = self.group_size
        self._step = self.reset(np.repeat(self.new_seeds(self.num_groups), g))
        for k in range(self.num_groups):
            gid = self._new_group(None, None, g)
            self._slot_group[k * g : (k + 1) * g] = gid
            self._slot_member[k * g : (k + 1) * g] = np.arange(g)
        self._cursor[:] = 0
        self._started = True

    def _finish(self, i: int, step: Step) -> None:
        """Slot ``i``'s episode ended: file it under its group, then give the slot new work."""
        buf, length = self._buf, int(self._cursor[i])
        assert buf is not None
        group = self._groups[int(self._slot_group[i])]
        group.episodes[int(self._slot_member[i])] = tuple(v[i, :length].clone() for v in buf.values())
        group.ended += 1
        if group.ended == self.group_size:
            self._ready.append(int(self._slot_group[i]))
        self._cursor[i] = 0
        if self._waiting:
            gid = self._waiting[0]
            waiting = self._groups[gid]
            assert waiting.first is not None
            self.vec.restore([i], [waiting.snapshot])
            step.put([i], waiting.first)
            self._slot_group[i], self._slot_member[i] = gid, waiting.started
            waiting.started += 1
            if waiting.started == self.group_size:
                self._waiting.popleft()
                waiting.snapshot, waiting.first = None, None
        else:
            # A fresh seed founds a group (envs restored from one snapshot share an RNG state and
            # would draw the same "new" state from an automatic reset).
            first = self.reset(self.new_seeds(1), np.array([i]))
            step.put([i], first)
            gid = self._new_group(self.vec.snapshot([i])[0], first, 1)
            self._slot_group[i], self._slot_member[i] = gid, 0
            self._waiting.append(gid)

    def update_steps(self) -> tuple[int, str, bool]:
        """The first collection's bound: its ``num_groups x G`` episodes start together."""
        n = self.vec.num_envs
        return n * self.max_steps, f"{n} envs x episodes of up to {self.max_steps} steps", False

    @torch.no_grad()
    def collect(self, policy: Policy) -> Batch:
        started = time.perf_counter()
        buf = self._alloc(policy)
        if not self._started:
            self._start()
        step = self._step
        assert step is not None
        n = self.vec.num_envs
        slots = torch.arange(n, device=self.device)
        t = 0
        while len(self._ready) < self.num_groups:
            obs_t, actions, logp, _ = self.act(policy, step)
            cur = torch.as_tensor(self._cursor, device=self.device)
            buf["obs"][slots, cur] = obs_t
            buf["actions"][slots, cur] = actions
            buf["logp"][slots, cur] = logp
            buf["alive"][slots, cur] = step.alive
            if "action_mask" in buf and step.action_mask is not None:
                buf["action_mask"][slots, cur] = step.action_mask
            step = self.env_step(self.env_actions(policy, actions))
            buf["rewards"][slots, cur] = step.rewards
            self._cursor += 1
            t += 1
            if bool(step.env_done.any()):
                for i in step.env_done.nonzero()[:, 0].tolist():
                    self._finish(int(i), step)
        self._step = step
        self.total_env_steps += t * n
        return self._assemble(t, n, time.perf_counter() - started)

    def _assemble(self, t: int, n: int, seconds: float) -> Batch:
        episodes: list[tuple[Any, ...]] = []
        for _ in range(self.num_groups):
            episodes.extend(self._groups.pop(self._ready.popleft()).episodes)  # type: ignore[arg-type]
        keys = list(self._buf or {})
        a = self.vec.layout.num_agents

        def padded(k: int) -> torch.Tensor:
            x = pad_sequence([e[k] for e in episodes], batch_first=True).to(self.device)  # [N, T, A, ...]
            return x.movedim(2, 1).reshape(len(episodes) * a, x.shape[1], *x.shape[3:])

        rolls = {key: padded(k) for k, key in enumerate(keys)}
        mask = rolls.pop("alive")
        rolls["rewards"] = rolls["rewards"] * mask
        rolls["mask"] = mask
        n_ep, t_max = len(episodes), mask.shape[1]
        rolls["agent"] = torch.arange(a, device=self.device).repeat(n_ep)[:, None].expand(n_ep * a, t_max).contiguous()
        ids = self.member_ids.reshape(-1).to(self.device)
        data = {k: v[ids] for k, v in rolls.items()}
        returns = rolls["rewards"].sum(-1).reshape(n_ep, a)
        lengths = mask.reshape(n_ep, a, t_max).any(1).sum(-1)
        metrics = {
            "rollout/steps": float(t * n),
            "rollout/vector_utilization": 1.0,
            "rollout/rollout_return_mean": float(returns.mean()),
            "rollout/groups_in_flight": float(len(self._groups)),
            "time/collect_s": seconds,
            **episode_metrics(returns, lengths, self.vec.agents, self.groups, "rollout"),
        }
        return Batch(data, group_size=self.group_size, metrics=metrics)

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "started": self._started,
            "vec": self.vec.get_state() if self._started else None,
            "step": None if self._step is None else self._step.copy(),
            "cursor": self._cursor.copy(),
            "slot_group": self._slot_group.copy(),
            "slot_member": self._slot_member.copy(),
            "buf": None if self._buf is None else {k: v.clone() for k, v in self._buf.items()},
            "groups": copy.deepcopy(self._groups),
            "waiting": list(self._waiting),
            "ready": list(self._ready),
            "next_gid": self._next_gid,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._started = state["started"]
        if state["vec"] is not None:
            self.vec.set_state(state["vec"])
        self._step = None if state["step"] is None else state["step"].to(self.device).copy()
        self._cursor = state["cursor"].copy()
        self._slot_group = state["slot_group"].copy()
        self._slot_member = state["slot_member"].copy()
        self._buf = None if state["buf"] is None else {k: v.to(self.device) for k, v in state["buf"].items()}
        self._groups = copy.deepcopy(state["groups"])
        self._waiting = deque(state["waiting"])
        self._ready = deque(state["ready"])
        self._next_gid = state["next_gid"]
