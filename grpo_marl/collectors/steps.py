"""Fixed-horizon steps (the PPO data path): ``n_steps`` of every env per call, streaming.

Episodes do not restart at update boundaries: the envs, the current step record and the running
episode statistics carry over to the next call, as in SB3/CleanRL, so an episode may span several
updates and the critic bootstraps from the observation after the last step. A finished env is
reset by the collector in the same step (fresh seed from its RNG); the observation that ended the
episode is kept as ``final_obs`` (with ``final_state``) for time-limit bootstrapping.

Rows are (env, agent) pairs ``[E * A, n_steps]`` (groups of one: PPO compares nothing); ``time``
is each step's elapsed fraction of its episode (a critic input for fixed-horizon tasks).

Resume is exact: the state holds every env's snapshot, the current step record and the episode
accumulators.
"""

from __future__ import annotations

import time as clock
from collections import deque
from typing import Any

import numpy as np
import torch

from grpo_marl.batch import Batch
from grpo_marl.collectors.base import Collector, rows_of
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.base import Policy
from grpo_marl.vec.base import Step, VecEnv


class StepCollector(Collector):
    """``n_steps`` steps of every env per call; env state streams across calls."""

    def __init__(
        self,
        vec: VecEnv,
        groups: AgentGroups,
        n_steps: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        env_name: str = "env",
        stats_window: int = 100,
    ) -> None:
        super().__init__(vec, device, seed, env_name)
        self.groups = groups
        self.n_steps = int(n_steps)
        n, a = vec.num_envs, vec.layout.num_agents
        self.horizon = float(vec.max_episode_steps or n_steps)
        self._step: Step | None = None
        self.ep_return = np.zeros((n, a), dtype=np.float64)
        self.ep_length = np.zeros(n, dtype=np.int64)
        # Completed-episode statistics over a sliding window (SB3's ep_info_buffer, 100 episodes).
        self.recent_returns: deque[float] = deque(maxlen=stats_window)
        self.recent_lengths: deque[int] = deque(maxlen=stats_window)

    def update_steps(self) -> tuple[int, str, bool]:
        n = self.vec.num_envs
        return n * self.n_steps, f"{n} envs x {self.n_steps} steps", True

    @torch.no_grad()
    def collect(self, policy: Policy) -> Batch:
        started = clock.perf_counter()
        vec, lay, dev = self.vec, self.vec.layout, self.device
        t_n, n, a = self.n_steps, vec.num_envs, lay.num_agents
        if self._step is None:
            self._step = self.reset(self.new_seeds(n))
        step = self._step
        obs = torch.zeros((t_n, n, a, *lay.obs_shape), dtype=lay.obs_torch_dtype, device=dev)
        actions_buf = torch.zeros((t_n, n, a, *policy.action_shape()), dtype=policy.action_dtype, device=dev)
        logp_buf = torch.zeros((t_n, n, a), device=dev)
        rewards = torch.zeros((t_n, n, a), dtype=torch.float32, device=dev)
        alive = torch.zeros((t_n, n, a), dtype=torch.bool, device=dev)
        terminated = torch.zeros((t_n, n, a), dtype=torch.bool, device=dev)
        truncated = torch.zeros((t_n, n, a), dtype=torch.bool, device=dev)
        final_obs = torch.zeros((t_n, n, a, *lay.obs_shape), dtype=lay.obs_torch_dtype, device=dev)
        elapsed = torch.zeros((t_n, n), dtype=torch.float32, device=dev)
        masks = (
            torch.zeros((t_n, n, a, max(lay.max_actions, 1)), dtype=torch.bool, device=dev)
            if lay.has_action_mask
            else None
        )
        states = final_states = None
        if vec.with_state:
            states = torch.zeros((t_n, n, lay.state_dim), dtype=torch.float32, device=dev)
            final_states = torch.zeros((t_n, n, lay.state_dim), dtype=torch.float32, device=dev)
        # Per-step bookkeeping runs where the records are: for a numpy env on the CPU in numpy views
        # of the same buffers (numpy's microseconds on small arrays, the records' own arrays), else
        # in torch on the device (a torch env's records never leave it).
        host = self._numpy_check
        view: Any = (lambda x: None if x is None else x.numpy()) if host else (lambda x: x)
        rewards_v, alive_v, term_v, trunc_v = view(rewards), view(alive), view(terminated), view(truncated)
        final_v, elapsed_v, masks_v = view(final_obs), view(elapsed), view(masks)
        states_v, final_states_v = view(states), view(final_states)
        ep_return: Any = self.ep_return.copy() if host else torch.as_tensor(self.ep_return, device=dev)
        ep_length: Any = self.ep_length.copy() if host else torch.as_tensor(self.ep_length, device=dev)
        finished_returns: list[float] = []
        finished_lengths: list[int] = []
        for t in range(t_n):
            obs_t, actions, logp, _ = self.act(policy, step)
            obs[t], actions_buf[t], logp_buf[t] = obs_t, actions, logp
            rec: Any = step.numpy() if host else step
            alive_v[t] = rec.alive
            # float64, then stored as float32
            elapsed_v[t] = ep_length / self.horizon if host else ep_length.double() / self.horizon
            if masks_v is not None and rec.action_mask is not None:
                masks_v[t] = rec.action_mask
            if states_v is not None and rec.state is not None:
                states_v[t] = rec.state
            step = self.env_step(self.env_actions(policy, actions))
            rec = step.numpy() if host else step
            rewards_v[t] = rec.rewards
            term_v[t] = rec.terminated
            trunc_v[t] = rec.truncated
            ep_return += rec.rewards
            ep_length += 1
            if bool(rec.env_done.any()):
                done = np.flatnonzero(rec.env_done) if host else rec.env_done.nonzero()[:, 0]
                final_v[t, done] = rec.obs[done]
                if final_states_v is not None and rec.state is not None:
                    final_states_v[t, done] = rec.state[done]
                finished_returns.extend(ep_return[done].mean(1).tolist())
                finished_lengths.extend(ep_length[done].tolist())
                ep_return[done] = 0.0
                ep_length[done] = 0
                rows = np.asarray(done.tolist(), dtype=np.int64)  # reset takes host indices
                step = step.copy()
                step.put(rows, self.reset(self.new_seeds(len(rows)), rows))
        self.ep_return = ep_return if host else ep_return.cpu().numpy()
        self.ep_length = ep_length if host else ep_length.cpu().numpy()
        self._step = step
        self.total_env_steps += n * t_n
        self.recent_returns.extend(finished_returns)
        self.recent_lengths.extend(finished_lengths)
        data = {
            "obs": rows_of(obs, dev),
            "actions": rows_of(actions_buf, dev),
            "logp": rows_of(logp_buf, dev),
            "rewards": rows_of(rewards, dev),
            "mask": rows_of(alive, dev),
            "terminated": rows_of(terminated, dev),
            "truncated": rows_of(truncated, dev),
            "final_obs": rows_of(final_obs, dev),
            "agent": torch.arange(a, device=dev).repeat(n)[:, None].expand(n * a, t_n).contiguous(),
            "time": rows_of(elapsed[:, :, None].expand(t_n, n, a), dev),
            "next_obs": step.obs.reshape(n * a, *lay.obs_shape).clone(),
            "next_time": torch.as_tensor(np.repeat(self.ep_length / self.horizon, a), device=dev, dtype=torch.float32),
        }
        if masks is not None:
            data["action_mask"] = rows_of(masks, dev)
        if states is not None and final_states is not None and step.state is not None:
            shape = (t_n, n, a, lay.state_dim)
            data["state"] = rows_of(states[:, :, None].expand(shape), dev)
            data["final_state"] = rows_of(final_states[:, :, None].expand(shape), dev)
            data["next_state"] = step.state.repeat_interleave(a, dim=0)
        metrics = {
            "rollout/steps": float(n * t_n),
            "rollout/episodes_finished": float(len(finished_returns)),
            "time/collect_s": clock.perf_counter() - started,
        }
        if self.recent_returns:
            r = np.asarray(self.recent_returns)
            metrics.update(
                {
                    "rollout/return_mean": float(r.mean()),
                    "rollout/return_std": float(r.std()),
                    "rollout/return_min": float(r.min()),
                    "rollout/return_max": float(r.max()),
                    "rollout/length_mean": float(np.mean(self.recent_lengths)),
                }
            )
        return Batch(data, group_size=1, metrics=metrics)

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            **super().state_dict(),
            "ep_return": self.ep_return.copy(),
            "ep_length": self.ep_length.copy(),
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "step": None if self._step is None else self._step.copy(),
        }
        if self._step is not None:
            state["vec"] = self.vec.get_state()  # raises SnapshotUnsupported naming what to change
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.ep_return = np.asarray(state["ep_return"], dtype=np.float64).copy()
        self.ep_length = np.asarray(state["ep_length"], dtype=np.int64).copy()
        self.recent_returns = deque(state["recent_returns"], maxlen=self.recent_returns.maxlen)
        self.recent_lengths = deque(state["recent_lengths"], maxlen=self.recent_lengths.maxlen)
        if state["step"] is None:
            self._step = None
            return
        self.vec.reset([0] * self.vec.num_envs)  # initialise wrappers/bookkeeping, then overwrite
        self.vec.set_state(state["vec"])
        self._step = state["step"].to(self.device).copy()
