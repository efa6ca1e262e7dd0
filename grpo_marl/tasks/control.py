"""The Task of every control env — Gymnasium (one agent) and PettingZoo (many) alike:
vector env -> actor policy -> collector, plus evaluation.

Rollout rows are (env, agent) trajectories; ``algo.group_mode`` picks which of them GRPO compares
(see :mod:`grpo_marl.groups`). Env steps are *joint* steps (one step of one env, whatever its
number of agents); returns are mean per-agent episode returns on the env's own reward scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from grpo_marl.batch import Batch
from grpo_marl.collectors import evaluate_policy, make_collector
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import EnvSpec
from grpo_marl.tasks.base import Task
from grpo_marl.vec import VecEnv, make_vec_env

MARL_DEFAULTS: dict[str, Any] = {
    "groups": None,  # agent -> group overrides (see grpo_marl.groups.resolve_group_map)
    "share": "group",  # group | agent: parameter sharing
    "agent_id": False,  # append a one-hot of the agent's index within its group
    "num_workers": -1,  # env processes for PettingZoo (-1 = auto, see grpo_marl.vec.resolve_workers)
}


def marl_settings(cfg: DictConfig) -> dict[str, Any]:
    """The ``marl`` config section with defaults filled (the section is optional)."""
    section = cfg.get("marl") or {}
    if isinstance(section, DictConfig):
        section = OmegaConf.to_container(section, resolve=True)
    return {**MARL_DEFAULTS, **dict(section)}  # type: ignore[arg-type]


def num_envs_of(cfg: DictConfig) -> int:
    """Vector width: ``vec.num_envs``, else the PPO family's ``n_envs``, else GRPO's groups."""
    a = cfg.algo
    if cfg.vec.num_envs:
        return int(cfg.vec.num_envs)
    if a.get("n_envs"):
        return int(a.n_envs)
    return int(a.get("num_groups", 1)) * int(a.get("group_size", 1))


class ControlTask(Task):
    """Everything env-specific the trainer needs for a Gymnasium or PettingZoo env."""

    def __init__(
        self, cfg: DictConfig, spec: EnvSpec, device: torch.device, collector: str = "episodes", with_state: bool = False
    ) -> None:
        self.cfg = cfg
        self.spec = spec
        self.device = device
        self.settings = marl_settings(cfg)
        self.env_kwargs = dict(cfg.env_kwargs or {})
        self.vectorization = str(cfg.vec.vectorization)
        self.with_state = with_state
        self.vec: VecEnv = self._make_vec(num_envs_of(cfg))
        self.groups = AgentGroups.from_layout(
            self.vec.layout,
            override=self.settings["groups"],
            share=str(self.settings["share"]),
            agent_id=bool(self.settings["agent_id"]),
        )
        p = cfg.policy
        self.policy = ActorPolicy(
            self.groups,
            hidden=tuple(p.hidden),
            activation=str(p.activation),
            log_std_init=float(p.log_std_init),
            normalize_obs=bool(p.normalize_obs),
        ).to(device)
        self.input_keys: tuple[str, ...] = ("obs", "actions", "agent")
        if self.vec.layout.has_action_mask:
            self.input_keys += ("action_mask",)
        self.collector = make_collector(collector, self.vec, self.groups, cfg, device)
        self._eval_vec: VecEnv | None = None
        self.last_eval: dict[str, float] = {}

    def _make_vec(self, num_envs: int, with_state: bool | None = None) -> VecEnv:
        return make_vec_env(
            self.spec,
            num_envs,
            self.env_kwargs,
            self.vectorization,
            with_state=self.with_state if with_state is None else with_state,
            num_workers=int(self.settings["num_workers"]),
        )

    # -- counters ----------------------------------------------------------------------------------
    @property
    def env_steps(self) -> int:
        return int(self.collector.total_env_steps)

    def set_env_steps(self, steps: int) -> None:
        self.collector.total_env_steps = int(steps)

    # -- data --------------------------------------------------------------------------------------
    def collect(self, policy: ActorPolicy) -> Batch:  # type: ignore[override]
        return self.collector.collect(policy)

    def log_prob(
        self, policy: ActorPolicy, mb: dict[str, Tensor], need_entropy: bool = True  # type: ignore[override]
    ) -> tuple[Tensor, Tensor | None]:
        obs, agent, actions = mb["obs"], mb["agent"], mb["actions"]
        lead = agent.shape
        n_act = len(policy.action_shape())
        mask = mb.get("action_mask")
        logp, ent = policy.log_prob(
            obs.reshape(-1, *obs.shape[len(lead) :]),
            agent.reshape(-1),
            actions.reshape(-1, *actions.shape[len(actions.shape) - n_act :]) if n_act else actions.reshape(-1),
            None if mask is None else mask.reshape(-1, mask.shape[-1]),
        )
        logp, ent = logp.reshape(lead), ent.reshape(lead)
        return logp, ent if need_entropy else None

    def end_update(self, batch: Batch) -> None:
        """Update observation statistics *after* the update, so old and new log-probs of this
        batch were computed with the same normaliser (the surrogate ratio stays exact)."""
        m = batch.mask
        self.policy.update_obs_stats(batch["obs"][m], batch["agent"][m])

    def evaluate(self, policy: ActorPolicy, episodes: int, seed_offset: int = 0) -> dict[str, float]:  # type: ignore[override]
        if self._eval_vec is None or self._eval_vec.num_envs != episodes:
            if self._eval_vec is not None:
                self._eval_vec.close()
            self._eval_vec = self._make_vec(episodes, with_state=False)
        seeds = 1_000_000 + 1000 * int(self.cfg.seed) + seed_offset + np.arange(episodes)
        self.last_eval = evaluate_policy(
            policy, self._eval_vec, seeds.tolist(), self.device, deterministic=bool(self.cfg.eval.deterministic)
        )
        return self.last_eval

    def summary_extra(self) -> dict[str, Any]:
        """Per-group and per-agent returns and the agent-groups, for multi-agent summaries."""
        if self.vec.layout.num_agents == 1:
            return {}
        per_group = {k.split("/", 2)[2]: v for k, v in self.last_eval.items() if k.startswith("eval/return_mean/")}
        per_agent = {k.split("/", 2)[2]: v for k, v in self.last_eval.items() if k.startswith("eval/agent_return/")}
        return {
            "return_unit": "mean per-agent episode return (env's own reward scale)",
            "per_group_return": per_group,
            "per_agent_return": per_agent,
            "agent_groups": self.groups.describe(),
            "group_mode": str(self.cfg.algo.get("group_mode", "")),
            "vector_env": type(self.vec).__name__,
        }

    # -- resume / end ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"collector": self.collector.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.collector.load_state_dict(state["collector"])

    def close(self) -> None:
        self.vec.close()
        if self._eval_vec is not None:
            self._eval_vec.close()
