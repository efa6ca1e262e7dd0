"""Episode groups (the GRPO data path): ``num_groups x G`` envs per collection, played to the end.

``E = S * G`` envs run in lock-step: ``S`` seed-groups of ``G`` envs that start from the same
joint state — the same reset seed (``seed`` / ``agent`` / ``seed_agent`` group modes), or one
snapshot of a state visited in the previous collection restored into all G (``state``). Each
(env, agent) pair becomes one rollout row; rows are arranged by
:func:`grpo_marl.groups.arrange_groups` so that the members of each GRPO group are contiguous.

``state`` groups: each seed-group's first env offers one snapshot at a random time of this
collection; the next collection restores archived snapshots into most groups and runs each
branch ``branch_horizon`` steps (or to the end), so start states move through whole episodes at no
extra "trunk" cost.

``rollout/return_mean`` (with ``_std``, ``_min``, ``_max``, ``length_mean``) is the mean return of
the episodes that *ended* during the collection: terminated, truncated by the env, or cut at the
collector's cap (``vec.max_steps``); ``rollout/episodes_finished`` counts them. In ``seed`` /
``agent`` / ``seed_agent`` modes those are the collection's own episodes. In ``state`` mode a
branch rarely holds a whole episode (Pendulum: 50-step branches of 200-step episodes): an episode
ends when a branch reaches the episode's end, and its return is the whole episode's, the rewards
of the chain of earlier branches (earlier collections, earlier policies) that led to the branch's
start state plus the branch's own; its length is the episode's. Updates in which no episode ended
log no return (the first few of a state-group run, while branch start states move toward the
episode's end). ``rollout/rollout_return_mean`` is the mean return of this collection's rollouts
(branches, in ``state`` mode), whole or not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo_marl.batch import Batch
from grpo_marl.collectors.base import Collector, Storage, episode_metrics, rows_of
from grpo_marl.errors import UserInputError
from grpo_marl.groups import GROUP_MODES, AgentGroups, arrange_groups, team_reward_fraction
from grpo_marl.policies.base import HostPolicy, Policy
from grpo_marl.vec.base import Step, VecEnv


@dataclass
class Archived:
    """A snapshot of one env at step ``t`` of its episode plus what the policy saw there."""

    snap: Any
    t: int
    step: Step
    #: per-agent return of the episode up to ``t`` (None: unknown, checkpoints from before it was kept)
    ret: np.ndarray | None = None


class EpisodeCollector(Collector):
    """Collects ``num_groups`` seed-groups x ``group_size`` envs of episodes per call."""

    def __init__(
        self,
        vec: VecEnv,
        groups: AgentGroups,
        num_groups: int,
        group_size: int,
        mode: str = "seed",
        device: torch.device | str = "cpu",
        seed: int = 0,
        max_steps: int | None = None,
        branch_horizon: int = 0,
        state_reset_frac: float = 0.25,
        env_name: str = "env",
        host: bool = True,
    ) -> None:
        super().__init__(vec, device, seed, env_name)
        # sample with the policy's numpy actor when it has one (MLP actors on the CPU): ~4x
        # cheaper per vector step than a torch call on a few dozen rows (grpo_marl/policies/host.py)
        self.host = host
        if mode not in GROUP_MODES:
            raise UserInputError(f"algo.group_mode={mode!r} is not valid; choose one of {', '.join(GROUP_MODES)}")
        if mode in ("agent", "seed_agent") and vec.layout.num_agents == 1:
            raise UserInputError(
                f"algo.group_mode={mode} compares the agents of one env, and env {env_name!r} has one agent; "
                "use algo.group_mode=seed or state"
            )
        if vec.num_envs != num_groups * group_size:
            raise UserInputError(
                f"the vector env has {vec.num_envs} envs but algo.num_groups * algo.group_size = "
                f"{num_groups * group_size}; leave vec.num_envs unset (it is derived) or make them match"
            )
        if mode == "state" and not vec.supports_snapshot:
            vec.snapshot([0])  # raises SnapshotUnsupported naming what to change
        cap = max_steps or vec.max_episode_steps
        if cap is None and vec.layout.num_agents == 1:
            # A Gymnasium env without a limit may never end; PettingZoo envs end by themselves
            # (every agent leaves), so their storage grows instead.
            raise UserInputError(
                f"env {env_name!r} has no episode limit (no TimeLimit wrapper, no max_episode_steps); "
                "set vec.max_steps to cap each rollout"
            )
        self.groups = groups
        self.num_groups = num_groups
        self.group_size = group_size
        self.mode = mode
        self.max_steps = int(cap) if cap else None
        self.horizon = int(branch_horizon) if (mode == "state" and branch_horizon) else (self.max_steps or 2**62)
        self.state_reset_frac = float(state_reset_frac)
        self.archive: list[Archived] = []
        # snapshot times of the first collection are drawn below this: within the branch it will run
        self.prev_len = min(self.max_steps or 50, 50, self.horizon)
        self.member_ids = torch.as_tensor(
            arrange_groups("seed" if mode == "state" else mode, num_groups, group_size, groups)
        )
        self._storage: Storage | None = None

    # -- collection ------------------------------------------------------------------------------
    def _start(self) -> tuple[Step, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Reset every env (members of a group share a seed); ``state`` mode restores archived
        snapshots into most groups. Returns the first step, each env's start time, which groups
        started from a reset, each env's episode return before its start ``[E, A]`` and whether
        that return is known."""
        g = self.group_size
        step = self.reset(np.repeat(self.new_seeds(self.num_groups), g))
        t0 = np.zeros(self.vec.num_envs, dtype=np.int64)
        ret0 = np.zeros((self.vec.num_envs, self.vec.layout.num_agents), dtype=np.float64)
        known = np.ones(self.vec.num_envs, dtype=bool)
        from_reset = np.ones(self.num_groups, dtype=bool)
        if self.mode == "state" and self.archive:
            n_restore = int(round(self.num_groups * (1.0 - self.state_reset_frac)))
            picks = self.rng.integers(0, len(self.archive), size=n_restore)
            idx: list[int] = []
            snaps: list[Any] = []
            for grp, k in zip(range(n_restore), picks, strict=True):
                item = self.archive[int(k)]
                members = np.arange(grp * g, (grp + 1) * g)
                idx.extend(members.tolist())
                snaps.extend([item.snap] * g)
                for e in members:
                    step.put([int(e)], item.step)
                t0[members] = item.t
                prefix = getattr(item, "ret", None)
                if prefix is None:
                    known[members] = False
                else:
                    ret0[members] = prefix
                from_reset[grp] = False
            self.vec.restore(idx, snaps)
        return step, t0, from_reset, ret0, known

    def update_steps(self) -> tuple[int, str, bool] | None:
        cap = min(self.horizon, self.max_steps or self.horizon)
        if cap >= 2**62:
            return None  # no episode limit (a PettingZoo env that ends by itself)
        n = self.vec.num_envs
        what = "branches" if self.mode == "state" else "episodes"
        return n * cap, f"{n} envs x {what} of up to {cap} steps", False

    @torch.no_grad()
    def collect(self, policy: Policy) -> Batch:
        started = time.perf_counter()
        if self._storage is None:
            self._storage = Storage(min(self.horizon, self.max_steps or 64), self.vec, policy, self.device)
        st = self._storage
        # the numpy actor serves numpy envs only: a torch env's records stay tensors end to end
        on_host = self.host and self.device.type == "cpu" and self.vec.backend == "numpy"
        make_host = getattr(policy, "host_actor", None) if on_host else None
        host = make_host() if make_host is not None else None
        step, t0, from_reset, ret0, known = self._start()
        n_env, g = self.vec.num_envs, self.group_size
        snap_at = np.full(n_env, -1, dtype=np.int64)
        new_archive: list[Archived] = []
        if self.mode == "state":
            # a uniform visited step of the previous collection (never 0: a reset gives that)
            snap_at[::g] = self.rng.integers(1, max(2, self.prev_len), size=self.num_groups)
        alive = step.alive.clone()
        st.alive.zero_()
        st.rewards.zero_()
        if host is not None:
            t, env_steps, alive = self._play_host(host, st, step, alive, snap_at, t0, ret0, known, new_archive)
        else:
            t, env_steps, alive = self._play(policy, st, step, alive, snap_at, t0, ret0, known, new_archive)
        if self.mode == "state":
            # Only states of this collection: when every group branched late and none lived to its
            # snapshot time, the archive empties and the next collection starts from resets (keeping
            # the old archive would replay its last state, one step from the end, forever).
            self.archive = new_archive
        self.prev_len = t
        self.total_env_steps += env_steps
        # Episodes that ended here: every agent done, or cut at the rollout cap; with a known return
        # before this collection (0 after a reset, the archived prefix after a restore).
        ended = ~alive.any(1).cpu().numpy()
        if self.max_steps:
            ended |= t0 + t >= self.max_steps
        return self._batch(st, t, env_steps, ended & known, t0, ret0, time.perf_counter() - started)

    def _archive_due(
        self,
        t: int,
        step: Step,
        st: Storage,
        snap_at: np.ndarray,
        t0: np.ndarray,
        ret0: np.ndarray,
        known: np.ndarray,
        new_archive: list[Archived],
    ) -> None:
        """``state`` mode: snapshot the envs whose snapshot time is ``t`` (and are still running)."""
        due_now = snap_at == t
        if not due_now.any():
            return
        due = np.flatnonzero(due_now & ~step.env_done.cpu().numpy())
        if not len(due):
            return
        for e, snap in zip(due, self.vec.snapshot(due.tolist()), strict=True):
            # the episode's return so far: before this branch + this branch's first t steps
            ret = None
            if known[e]:
                ret = ret0[e] + (st.rewards[:t, e] * st.alive[:t, e]).sum(0).cpu().numpy().astype(np.float64)
            new_archive.append(Archived(snap, int(t0[e] + t), step.rows([int(e)]), ret))

    def _play(
        self,
        policy: Policy,
        st: Storage,
        step: Step,
        alive: Tensor,
        snap_at: np.ndarray,
        t0: np.ndarray,
        ret0: np.ndarray,
        known: np.ndarray,
        new_archive: list[Archived],
    ) -> tuple[int, int, Tensor]:
        """The torch loop: every tensor stays on the collector's device (and, for an env on that
        device, never leaves it); one synchronisation per step, the loop's ``alive.any()``."""
        env_steps = torch.zeros((), dtype=torch.long, device=self.device)
        t = 0
        while t < self.horizon and bool(alive.any()):
            if self.mode == "state":
                self._archive_due(t, step, st, snap_at, t0, ret0, known, new_archive)
            if t == st.capacity:
                st.grow()
            _, actions, logp, _ = self.act(policy, step)
            st.obs[t] = step.obs
            st.actions[t] = actions
            st.logp[t] = logp
            st.alive[t] = alive
            if st.action_mask is not None and step.action_mask is not None:
                st.action_mask[t] = step.action_mask
            env_steps += (~step.env_done).sum()
            step = self.env_step(self.env_actions(policy, actions))
            st.rewards[t] = step.rewards
            alive &= step.alive
            t += 1
        return t, int(env_steps), alive

    def _play_host(
        self,
        host: HostPolicy,
        st: Storage,
        step: Step,
        alive_t: Tensor,
        snap_at: np.ndarray,
        t0: np.ndarray,
        ret0: np.ndarray,
        known: np.ndarray,
        new_archive: list[Archived],
    ) -> tuple[int, int, Tensor]:
        """The CPU loop of a numpy actor: the same storage and records, read and written through
        numpy views of their tensors (free to take), so a step costs numpy's few microseconds per
        small array rather than torch's dispatch per operator."""
        obs_v, actions_v, logp_v = st.obs.numpy(), st.actions.numpy(), st.logp.numpy()
        rewards_v, alive_v = st.rewards.numpy(), st.alive.numpy()
        mask_v = None if st.action_mask is None else st.action_mask.numpy()
        alive = alive_t.numpy()
        env_steps = 0
        t = 0
        while t < self.horizon and alive.any():
            if self.mode == "state":
                self._archive_due(t, step, st, snap_at, t0, ret0, known, new_archive)
            if t == st.capacity:
                st.grow()
                obs_v, actions_v, logp_v = st.obs.numpy(), st.actions.numpy(), st.logp.numpy()
                rewards_v, alive_v = st.rewards.numpy(), st.alive.numpy()
                mask_v = None if st.action_mask is None else st.action_mask.numpy()
            rec = step.numpy()  # a numpy env's own arrays: free
            obs, mask = rec.obs, rec.action_mask
            actions_np, logp_np = host.sample(obs, mask if self.has_mask else None, self.action_rng)
            obs_v[t] = obs
            actions_v[t] = actions_np
            logp_v[t] = logp_np
            alive_v[t] = alive
            if mask_v is not None and mask is not None:
                mask_v[t] = mask
            env_steps += int((~rec.env_done).sum())
            step = self.env_step(torch.from_numpy(host.to_env(actions_np)))  # a numpy env: on the CPU
            rec = step.numpy()
            rewards_v[t] = rec.rewards
            alive = alive & rec.alive
            t += 1
        return t, env_steps, torch.from_numpy(alive)

    def _batch(
        self,
        st: Storage,
        t: int,
        env_steps: int,
        full: np.ndarray,
        t0: np.ndarray,
        ret0: np.ndarray,
        seconds: float,
    ) -> Batch:
        """The rollout rows; ``full`` marks the envs whose episode ended in this collection, with
        ``ret0`` its return and ``t0`` its length before the collection (``state`` mode)."""
        n_e, n_a = self.vec.num_envs, self.vec.layout.num_agents
        mask = rows_of(st.alive[:t], self.device)
        rewards = rows_of(st.rewards[:t], self.device) * mask
        rolls = {
            "obs": rows_of(st.obs[:t], self.device),
            "actions": rows_of(st.actions[:t], self.device),
            "logp": rows_of(st.logp[:t], self.device),
            "rewards": rewards,
            "mask": mask,
            "agent": torch.arange(n_a, device=self.device).repeat(n_e)[:, None].expand(n_e * n_a, t).contiguous(),
        }
        if st.action_mask is not None:
            rolls["action_mask"] = rows_of(st.action_mask[:t], self.device)
        ids = self.member_ids.reshape(-1)
        pad = ids < 0
        take = ids.clamp(min=0).to(self.device)
        data = {k: v[take] for k, v in rolls.items()} if not bool((ids == torch.arange(len(ids))).all()) else rolls
        if bool(pad.any()):
            data["mask"][pad] = False
            data["rewards"][pad] = 0.0
        returns = (rewards.sum(-1)).reshape(n_e, n_a)
        lengths = mask.reshape(n_e, n_a, t).any(1).sum(-1)
        metrics = {
            "rollout/steps": float(env_steps),
            "rollout/episodes": float(n_e),
            "rollout/rollout_return_mean": float(returns.mean(1).mean()),
            "rollout/vector_utilization": env_steps / max(t * n_e, 1),
            "time/collect_s": seconds,
            "time/collect_env_sps": env_steps / max(seconds, 1e-9),
        }
        full_t = torch.as_tensor(full)
        metrics["rollout/episodes_finished"] = float(full.sum())
        if bool(full_t.any()):
            ep_returns = returns[full_t].cpu() + torch.as_tensor(ret0[full], dtype=returns.dtype)
            ep_lengths = lengths[full_t].cpu() + torch.as_tensor(t0[full], dtype=lengths.dtype)
            metrics.update(episode_metrics(ep_returns, ep_lengths, self.vec.agents, self.groups, "rollout"))
        if n_a > 1:
            metrics["rollout/team_reward_frac"] = team_reward_fraction(
                rewards.reshape(n_e, n_a, t).cpu(), mask.reshape(n_e, n_a, t).cpu()
            )
        if self.mode == "state":
            metrics["rollout/frac_restored_groups"] = float((t0[:: self.group_size] > 0).mean())
            metrics["rollout/branch_start_mean"] = float(t0.mean())
        return Batch(data, group_size=int(self.member_ids.shape[1]), metrics=metrics)

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "archive": self.archive, "prev_len": self.prev_len}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.archive = list(state["archive"])
        self.prev_len = int(state["prev_len"])
