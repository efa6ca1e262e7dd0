"""Episode collection for multi-agent GRPO (and the episodic PPO baselines).

One collection runs ``E = S * G`` envs in lock-step: ``S`` seed-groups of ``G`` envs that start
from the same joint state — the same reset seed (``seed`` / ``agent`` / ``seed_agent``
groupings), or one snapshot of a state visited in the previous collection restored into all G
(``state``). Every (env, agent) pair becomes one rollout row of the Batch; rows are ordered by
:func:`grpo_marl.marl.advantages.arrange_groups` so that the members of each GRPO group are
contiguous (padding rows have an all-False mask).

Per step the hot loop does one batched policy call for all agents of all envs and one vector
step; trajectories are kept as per-step numpy arrays and reshaped once at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from grpo_marl.batch import Batch
from grpo_marl.marl.advantages import arrange_groups, team_reward_fraction
from grpo_marl.marl.groups import AgentGroups
from grpo_marl.marl.policy import MultiAgentPolicy
from grpo_marl.marl.vector import MarlVecEnv, VecStep

MODES: tuple[str, ...] = ("seed", "state", "agent", "seed_agent")


@dataclass
class _Archived:
    """A snapshot of one env at the start of step ``t`` plus what the policy saw there."""

    snap: Any
    t: int
    obs: np.ndarray
    alive: np.ndarray
    action_mask: np.ndarray
    state: np.ndarray | None


@dataclass
class Trajectories:
    """Raw per-step arrays of one collection, time-major ``[T, E, A, ...]``."""

    obs: np.ndarray
    actions: np.ndarray
    logp: np.ndarray
    alive: np.ndarray
    action_mask: np.ndarray
    rewards: np.ndarray
    state: np.ndarray | None
    env_steps: int
    seconds: float
    extras: dict[str, Any] = field(default_factory=dict)
    # bootstrap=True only: per step, the observation/state after it and whether the agent's
    # trajectory was truncated there (time limit or collection horizon, not a termination)
    next_obs: np.ndarray | None = None
    next_state: np.ndarray | None = None
    truncated: np.ndarray | None = None


class MarlEpisodeCollector:
    """Collects ``num_groups`` seed-groups x ``group_size`` envs of episodes per call.

    mode: ``seed`` | ``state`` | ``agent`` | ``seed_agent`` (see :mod:`grpo_marl.marl.advantages`;
    ``state`` arranges like ``seed`` but its copies branch from an archived snapshot).
    """

    def __init__(
        self,
        vec: MarlVecEnv,
        groups: AgentGroups,
        num_groups: int,
        group_size: int,
        mode: str = "seed",
        device: torch.device | str = "cpu",
        seed: int = 0,
        max_steps: int | None = None,
        with_state: bool = False,
        branch_horizon: int = 0,
        state_reset_frac: float = 0.25,
        bootstrap: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"algo.group_mode={mode!r} is not a multi-agent grouping; choose one of {MODES}")
        if vec.num_envs != num_groups * group_size:
            raise ValueError(f"vector env has {vec.num_envs} envs, need num_groups*group_size={num_groups * group_size}")
        self.vec = vec
        self.groups = groups
        self.num_groups = num_groups
        self.group_size = group_size
        self.mode = mode
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        self.seed = int(seed)
        self.max_steps = int(max_steps) if max_steps else None
        self.with_state = with_state
        self.branch_horizon = int(branch_horizon) if mode == "state" else 0
        self.state_reset_frac = float(state_reset_frac)
        self.bootstrap = bool(bootstrap)
        self.archive: list[_Archived] = []
        self.prev_len = int(self.max_steps or 25)  # steps of the last collection (snapshot times)
        self.episode_counter = 0
        self.total_env_steps = 0
        arrangement = "seed" if mode == "state" else mode
        self.member_ids = arrange_groups(arrangement, num_groups, group_size, groups)

    # -- collection ------------------------------------------------------------------------
    def _next_seeds(self) -> list[int]:
        base = (self.seed * 1_000_003 + self.episode_counter) % (2**31 - 1)
        self.episode_counter += self.num_groups
        return [base + s for s in range(self.num_groups) for _ in range(self.group_size)]

    def _start(self) -> tuple[VecStep, np.ndarray]:
        """Reset (and for ``state`` groups restore archived snapshots); returns the first step and
        each env's starting time index."""
        step = self.vec.reset(self._next_seeds(), with_state=self.with_state)
        t0 = np.zeros(self.vec.num_envs, dtype=np.int64)
        if self.mode != "state" or not self.archive:
            return step, t0
        idx: list[int] = []
        snaps: list[Any] = []
        for s in range(self.num_groups):
            if self.rng.random() < self.state_reset_frac:
                continue
            item = self.archive[int(self.rng.integers(len(self.archive)))]
            for m in range(self.group_size):
                e = s * self.group_size + m
                idx.append(e)
                snaps.append(item.snap)
                step.obs[e] = item.obs
                step.alive[e] = item.alive
                step.action_mask[e] = item.action_mask
                if step.state is not None and item.state is not None:
                    step.state[e] = item.state
                t0[e] = item.t
        if idx:
            self.vec.set_snapshots(idx, snaps)
        return step, t0

    @torch.no_grad()
    def run(self, policy: MultiAgentPolicy) -> Trajectories:
        """Play one collection with ``policy``; no Batch layout yet (see :meth:`collect`)."""
        start = time.perf_counter()
        step, t0 = self._start()
        n_env = self.vec.num_envs
        # state mode: archive one random visited state per seed-group for the next collection
        snap_at = np.full(n_env, -1, dtype=np.int64)
        if self.mode == "state":
            self.archive = []
            # a uniform visited step of the previous collection's episodes (never step 0: that is
            # what a fresh reset already gives)
            hi = max(2, self.prev_len)
            for s in range(self.num_groups):
                snap_at[s * self.group_size] = int(self.rng.integers(1, hi))
        horizon = self.branch_horizon or self.max_steps or 10**9
        has_mask = any(spec.has_action_mask for spec in self.groups.specs.values())
        keys = ("obs", "actions", "logp", "alive", "mask", "rewards", "state", "next_obs", "next_state", "trunc")
        rec: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        env_steps = 0
        t = 0
        while not step.env_done.all() and t < horizon:
            if self.mode == "state":
                due = np.nonzero((snap_at == t) & ~step.env_done)[0]
                if len(due):
                    for e, snap in zip(due, self.vec.get_snapshots(list(map(int, due))), strict=True):
                        self.archive.append(
                            _Archived(
                                snap=snap,
                                t=int(t0[e] + t),
                                obs=step.obs[e].copy(),
                                alive=step.alive[e].copy(),
                                action_mask=step.action_mask[e].copy(),
                                state=None if step.state is None else step.state[e].copy(),
                            )
                        )
            obs_t = torch.from_numpy(step.obs).to(self.device)
            mask_t = torch.from_numpy(step.action_mask).to(self.device) if has_mask else None
            actions, logp = policy.act(obs_t, mask_t)
            nxt = self.vec.step(policy.to_env(actions))
            rec["obs"].append(step.obs)
            rec["actions"].append(actions.cpu().numpy())
            rec["logp"].append(logp.cpu().numpy())
            rec["alive"].append(step.alive)
            rec["mask"].append(step.action_mask)
            rec["rewards"].append(nxt.rewards)
            if step.state is not None:
                rec["state"].append(step.state)
            if self.bootstrap:
                rec["next_obs"].append(nxt.obs)
                rec["trunc"].append(step.alive & nxt.truncated & ~nxt.terminated)
                if nxt.state is not None:
                    rec["next_state"].append(nxt.state)
            env_steps += int((~step.env_done).sum())
            step = nxt
            t += 1
        if t == 0:
            raise RuntimeError("every env finished at reset; nothing to collect")
        self.prev_len = t
        self.total_env_steps += env_steps
        boot: dict[str, Any] = {}
        if self.bootstrap:
            # agents still running when the collection horizon cut them off are truncated too
            rec["trunc"][-1] = rec["trunc"][-1] | (rec["alive"][-1] & step.alive)
            boot = {
                "next_obs": np.stack(rec["next_obs"]),
                "truncated": np.stack(rec["trunc"]),
                "next_state": np.stack(rec["next_state"]) if rec["next_state"] else None,
            }
        return Trajectories(
            obs=np.stack(rec["obs"]),
            actions=np.stack(rec["actions"]),
            logp=np.stack(rec["logp"]),
            alive=np.stack(rec["alive"]),
            action_mask=np.stack(rec["mask"]),
            rewards=np.stack(rec["rewards"]),
            state=np.stack(rec["state"]) if rec["state"] else None,
            env_steps=env_steps,
            seconds=time.perf_counter() - start,
            extras={"t0": t0, "truncated_by_horizon": not step.env_done.all()},
            **boot,
        )

    def collect(self, policy: MultiAgentPolicy) -> Batch:
        """One collection as a GRPO Batch (rows = agent trajectories, groups contiguous)."""
        traj = self.run(policy)
        return self.to_batch(traj)

    # -- layout ----------------------------------------------------------------------------
    def rollout_tensors(self, traj: Trajectories) -> dict[str, torch.Tensor]:
        """``[T, E, A, ...]`` -> rollout-major ``[E * A, T, ...]`` tensors (rollout ``e * A + a``)."""
        n_t, n_e, n_a = traj.alive.shape

        def roll(x: np.ndarray) -> torch.Tensor:
            y = np.moveaxis(x, 0, 2)  # [E, A, T, ...]
            return torch.from_numpy(np.ascontiguousarray(y.reshape(n_e * n_a, n_t, *x.shape[3:])))

        out = {
            "obs": roll(traj.obs),
            "actions": roll(traj.actions),
            "logp": roll(traj.logp.astype(np.float32)),
            "rewards": roll(traj.rewards.astype(np.float32)),
            "mask": roll(traj.alive),
            "agent": torch.arange(n_a).repeat(n_e)[:, None].expand(n_e * n_a, n_t).contiguous(),
        }
        if any(spec.has_action_mask for spec in self.groups.specs.values()):
            out["action_mask"] = roll(traj.action_mask)
        if traj.state is not None:
            # every agent of an env sees the same global state: [T, E, S] -> [E * A, T, S]
            st = np.broadcast_to(traj.state[:, :, None, :], (n_t, n_e, n_a, traj.state.shape[-1]))
            out["state"] = roll(np.ascontiguousarray(st))
        if traj.truncated is not None:
            out["truncated"] = roll(traj.truncated)
            out["next_obs"] = roll(traj.next_obs)
            if traj.next_state is not None:
                st = np.broadcast_to(traj.next_state[:, :, None, :], (n_t, n_e, n_a, traj.next_state.shape[-1]))
                out["next_state"] = roll(np.ascontiguousarray(st))
        return out

    def to_batch(self, traj: Trajectories) -> Batch:
        rolls = self.rollout_tensors(traj)
        ids = torch.as_tensor(self.member_ids.reshape(-1))
        pad = ids < 0
        take = ids.clamp(min=0)
        data = {k: v[take] for k, v in rolls.items()}
        if pad.any():
            data["mask"][pad] = False
            data["rewards"][pad] = 0.0
            if "truncated" in data:
                data["truncated"][pad] = False
        data = {k: v.to(self.device) for k, v in data.items()}
        batch = Batch(data, group_size=int(self.member_ids.shape[1]), metrics=self.metrics(traj, rolls))
        return batch

    def metrics(self, traj: Trajectories, rolls: dict[str, torch.Tensor]) -> dict[str, float]:
        """Per-agent and per-group episode returns (mpe2 reward scale), lengths, env speed."""
        n_t, n_e, n_a = traj.alive.shape
        ret = (rolls["rewards"] * rolls["mask"]).sum(-1).reshape(n_e, n_a)
        m: dict[str, float] = {
            "rollout/return_mean": float(ret.mean()),
            "rollout/return_std": float(ret.mean(1).std()) if n_e > 1 else 0.0,
            "rollout/episode_len": float(traj.alive.any(2).sum(0).mean()),
            "rollout/episodes": float(n_e),
            "rollout/env_steps": float(traj.env_steps),
            "time/collect_env_sps": traj.env_steps / max(traj.seconds, 1e-9),
        }
        for g, spec in self.groups.specs.items():
            cols = [self.groups.agents.index(a) for a in spec.agents]
            m[f"rollout/return_mean/{g}"] = float(ret[:, cols].mean())
        for i, a in enumerate(self.groups.agents):
            m[f"rollout/agent_return/{a}"] = float(ret[:, i].mean())
        rew = torch.from_numpy(traj.rewards).permute(1, 2, 0)
        alive = torch.from_numpy(traj.alive).permute(1, 2, 0)
        m["rollout/team_reward_frac"] = team_reward_fraction(rew, alive)
        if self.mode == "state":
            m["rollout/branch_start_mean"] = float(traj.extras["t0"].mean())
        return m

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "episode_counter": self.episode_counter,
            "total_env_steps": self.total_env_steps,
            "archive": self.archive,
            "prev_len": self.prev_len,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.episode_counter = int(state["episode_counter"])
        self.total_env_steps = int(state["total_env_steps"])
        self.archive = list(state.get("archive", []))
        self.prev_len = int(state.get("prev_len", self.prev_len))


@torch.no_grad()
def evaluate_marl_policy(
    policy: MultiAgentPolicy,
    vec: MarlVecEnv,
    seeds: list[int],
    device: torch.device | str = "cpu",
    deterministic: bool = True,
) -> dict[str, float]:
    """Greedy episodes (one per seed, ``len(seeds) == vec.num_envs``): mean per-agent return,
    its std over episodes, and per-group / per-agent means, as ``eval/...`` metrics."""
    step = vec.reset(seeds)
    has_mask = any(spec.has_action_mask for spec in policy.groups.specs.values())
    ret = np.zeros((vec.num_envs, len(vec.agents)))
    while not step.env_done.all():
        mask = torch.from_numpy(step.action_mask).to(device) if has_mask else None
        actions, _ = policy.act(torch.from_numpy(step.obs).to(device), mask, deterministic=deterministic)
        step = vec.step(policy.to_env(actions))
        ret += step.rewards
    per_ep = ret.mean(1)
    out = {
        "eval/return_mean": float(ret.mean()),
        "eval/return_std": float(per_ep.std()),
        "eval/return_min": float(per_ep.min()),
        "eval/return_max": float(per_ep.max()),
        "eval/episodes": float(vec.num_envs),
    }
    for g, spec in policy.groups.specs.items():
        cols = [list(vec.agents).index(a) for a in spec.agents]
        out[f"eval/return_mean/{g}"] = float(ret[:, cols].mean())
    for i, a in enumerate(vec.agents):
        out[f"eval/agent_return/{a}"] = float(ret[:, i].mean())
    return out
