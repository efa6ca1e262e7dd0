"""Episode groups (the GRPO data path): ``num_groups x G`` envs per collection, played to the end.

``E = S * G`` envs run in lock-step: ``S`` seed-groups of ``G`` envs that start from the same
joint state, the same reset seed (``seed`` / ``agent`` / ``seed_agent`` group modes). Each
(env, agent) pair becomes one rollout row; rows are arranged by the group mode
(:meth:`grpo_marl.groups.GroupMode.arrange`) so that the members of each GRPO group are contiguous.
Group modes that start members from env snapshots (``state``) are played by the subclass in
:mod:`grpo_marl.collectors.states`, through this class's hooks (:meth:`EpisodeCollector._start`,
:meth:`~EpisodeCollector._visit`, :meth:`~EpisodeCollector._finish`,
:meth:`~EpisodeCollector._extra_metrics`); :func:`grpo_marl.collectors.episode_collector` picks
the class from the mode.

``rollout/return_mean`` (with ``_std``, ``_min``, ``_max``, ``length_mean``) is the mean return of
the episodes that *ended* during the collection: terminated, truncated by the env, or cut at the
collector's cap (``vec.max_steps``); ``rollout/episodes_finished`` counts them: here the
collection's own episodes (see :mod:`grpo_marl.collectors.states` for branches).
``rollout/rollout_return_mean`` is the mean return of this collection's rollouts, whole or not.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from grpo_marl.batch import Batch
from grpo_marl.collectors.base import Collector, Storage, episode_metrics, rows_of
from grpo_marl.errors import UserInputError
from grpo_marl.groups import AgentGroups, GroupMode, group_mode, team_reward_fraction
from grpo_marl.policies.base import HostPolicy, Policy
from grpo_marl.vec.base import Step, VecEnv


class EpisodeCollector(Collector):
    """Collects ``num_groups`` seed-groups x ``group_size`` envs of episodes per call."""

    #: what one rollout of a collection is, for the run's start-up line
    what = "episodes"

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
        env_name: str = "env",
        host: bool = True,
    ) -> None:
        super().__init__(vec, device, seed, env_name)
        # sample with the policy's numpy actor when it has one (MLP actors on the CPU): ~4x
        # cheaper per vector step than a torch call on a few dozen rows (grpo_marl/policies/host.py)
        self.host = host
        self.group_mode: GroupMode = group_mode(mode)
        self._check_mode(self.group_mode)
        if self.group_mode.multi_agent and vec.layout.num_agents == 1:
            raise UserInputError(
                f"algo.group_mode={mode} compares the agents of one env, and env {env_name!r} has one agent; "
                "use algo.group_mode=seed or state"
            )
        if vec.num_envs != num_groups * group_size:
            raise UserInputError(
                f"the vector env has {vec.num_envs} envs but algo.num_groups * algo.group_size = "
                f"{num_groups * group_size}; leave vec.num_envs unset (it is derived) or make them match"
            )
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
        #: steps a collection runs at most (the subclass's branches may be shorter than episodes)
        self.horizon = self.max_steps or 2**62
        self.member_ids = torch.as_tensor(self.group_mode.arrange(num_groups, group_size, groups))
        self._storage: Storage | None = None

    def _check_mode(self, mode: GroupMode) -> None:
        if mode.snapshots:
            raise UserInputError(
                f"algo.group_mode={mode.name} starts members from env snapshots: collect it with "
                "grpo_marl.collectors.StateGroupCollector (grpo_marl.collectors.episode_collector picks it)"
            )

    # -- collection ------------------------------------------------------------------------------
    def _start(self) -> tuple[Step, np.ndarray, np.ndarray, np.ndarray]:
        """Reset every env (members of a group share a seed). Returns the first step, each env's
        start time within its episode ``[E]``, its episode return before that ``[E, A]`` and whether
        that return is known ``[E]`` (all 0 / 0 / True here: every episode starts now)."""
        step = self.reset(np.repeat(self.new_seeds(self.num_groups), self.group_size))
        t0 = np.zeros(self.vec.num_envs, dtype=np.int64)
        ret0 = np.zeros((self.vec.num_envs, self.vec.layout.num_agents), dtype=np.float64)
        known = np.ones(self.vec.num_envs, dtype=bool)
        return step, t0, ret0, known

    def _visit(self, t: int, step: Step, st: Storage, t0: np.ndarray, ret0: np.ndarray, known: np.ndarray) -> None:
        """Called before the policy acts at step ``t`` of the collection (nothing here; the state
        collector takes its snapshots)."""

    def _finish(self, t: int) -> None:
        """Called once the collection's ``t`` steps are played (nothing here)."""

    def _extra_metrics(self, t0: np.ndarray) -> dict[str, float]:
        """The subclass's own ``rollout/*`` metrics of a collection (none here)."""
        return {}

    def update_steps(self) -> tuple[int, str, bool] | None:
        cap = min(self.horizon, self.max_steps or self.horizon)
        if cap >= 2**62:
            return None  # no episode limit (a PettingZoo env that ends by itself)
        n = self.vec.num_envs
        return n * cap, f"{n} envs x {self.what} of up to {cap} steps", False

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
        step, t0, ret0, known = self._start()
        alive = step.alive.clone()
        st.alive.zero_()
        st.rewards.zero_()
        if host is not None:
            t, env_steps, alive = self._play_host(host, st, step, alive, t0, ret0, known)
        else:
            t, env_steps, alive = self._play(policy, st, step, alive, t0, ret0, known)
        self._finish(t)
        self.total_env_steps += env_steps
        # Episodes that ended here: every agent done, or cut at the rollout cap; with a known return
        # before this collection (0 after a reset, an archived prefix after a restore).
        ended = ~alive.any(1).cpu().numpy()
        if self.max_steps:
            ended |= t0 + t >= self.max_steps
        return self._batch(st, t, env_steps, ended & known, t0, ret0, time.perf_counter() - started)

    def _play(
        self,
        policy: Policy,
        st: Storage,
        step: Step,
        alive: Tensor,
        t0: np.ndarray,
        ret0: np.ndarray,
        known: np.ndarray,
    ) -> tuple[int, int, Tensor]:
        """The torch loop: every tensor stays on the collector's device (and, for an env on that
        device, never leaves it); one synchronisation per step, the loop's ``alive.any()``."""
        env_steps = torch.zeros((), dtype=torch.long, device=self.device)
        t = 0
        while t < self.horizon and bool(alive.any()):
            self._visit(t, step, st, t0, ret0, known)
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
        t0: np.ndarray,
        ret0: np.ndarray,
        known: np.ndarray,
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
            self._visit(t, step, st, t0, ret0, known)
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
        ``ret0`` its return and ``t0`` its length before the collection (0 unless restored)."""
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
        metrics.update(self._extra_metrics(t0))
        return Batch(data, group_size=int(self.member_ids.shape[1]), metrics=metrics)
