"""Task glue for multi-agent PettingZoo envs (env kind ``pettingzoo``).

Builds the agent-groups (``marl.groups`` / ``marl.share`` / ``marl.agent_id``), the
multi-process lock-step vector env, the per-group policy and the episode collector, and scores
actions for the losses. Rollout rows are agent trajectories; ``algo.group_mode`` picks which of
them GRPO compares:

* ``seed`` — the same agent over G copies of one joint initial state (works with team rewards);
* ``agent`` — members of one agent-group within one episode (needs individual rewards: with a
  team reward all members share one return and every group has zero variance);
* ``seed_agent`` — an agent-group's members over the G copies (larger baseline);
* ``state`` — like ``seed``, but the G copies branch from one snapshot of a visited state.

Env steps are *joint* steps (one ``ParallelEnv.step`` of one env), the unit mpe2's speed is
quoted in; returns are mean per-agent episode returns on the env's own reward scale.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from grpo_marl.batch import Batch
from grpo_marl.tasks.base import CollectorTask
from grpo_marl.marl.groups import AgentGroups
from grpo_marl.marl.policy import MultiAgentPolicy
from grpo_marl.marl.rollout import MarlEpisodeCollector, evaluate_marl_policy
from grpo_marl.marl.vector import MarlVecEnv
from grpo_marl.registry import EnvSpec

# name -> factory(task, cfg) building a collector; the PPO baselines register theirs here.
COLLECTORS: dict[str, Callable[["MARLTask", DictConfig], Any]] = {}

MARL_DEFAULTS: dict[str, Any] = {
    "groups": None,  # agent -> group overrides (see grpo_marl.marl.groups.resolve_group_map)
    "share": "group",  # group | agent: parameter sharing
    "agent_id": False,  # append a one-hot of the agent's index within its group
    "num_workers": -1,  # env processes (-1 = auto, see resolve_workers; 0 = in-process)
}


def register_marl_collector(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        COLLECTORS[name] = fn
        return fn

    return decorator


def marl_settings(cfg: DictConfig) -> dict[str, Any]:
    """The ``marl`` config section with defaults filled (the section is optional)."""
    section = cfg.get("marl") or {}
    if isinstance(section, DictConfig):
        section = OmegaConf.to_container(section, resolve=True)
    return {**MARL_DEFAULTS, **dict(section)}  # type: ignore[arg-type]


def resolve_workers(requested: int, num_envs: int, cpus: int | None = None) -> int:
    """``-1`` (auto) -> in-process on machines with <= 2 cores or below 16 envs, else one worker
    per core but one (the main process runs the policy), at most one per 8 envs.

    Measured on the 2-core dev machine (simple_spread x128, benchmarks/marl_speed.py): the
    in-process collector ran 5,600 joint steps/s and the 2-worker one 3,200 — with no spare core,
    workers only add pipe traffic and contend with the policy forward.
    """
    if requested >= 0:
        return min(requested, num_envs)
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    if num_envs < 16 or cpus <= 2:
        return 0
    return max(1, min(cpus - 1, num_envs // 8))


@register_marl_collector("episodes")
def _episode_collector(task: "MARLTask", cfg: DictConfig) -> MarlEpisodeCollector:
    a = cfg.algo
    return MarlEpisodeCollector(
        task.vec,
        task.groups,
        num_groups=int(a.num_groups),
        group_size=int(a.group_size),
        mode=str(a.group_mode),
        device=task.device,
        seed=int(cfg.seed),
        max_steps=cfg.vec.max_steps,
        with_state=False,
        branch_horizon=int(a.get("branch_horizon", 0) or 0),
        state_reset_frac=float(a.get("state_reset_frac", 0.25)),
    )


@register_marl_collector("episodes_ppo")
def _ppo_episode_collector(task: "MARLTask", cfg: DictConfig) -> MarlEpisodeCollector:
    """IPPO/MAPPO: ``algo.n_envs`` independent episodes per update (groups of one), with the
    global state recorded for MAPPO's centralized critic."""
    a = cfg.algo
    return MarlEpisodeCollector(
        task.vec,
        task.groups,
        num_groups=task.vec.num_envs,
        group_size=1,
        mode="seed",
        device=task.device,
        seed=int(cfg.seed),
        max_steps=cfg.vec.max_steps,
        with_state=str(a.name) == "mappo",
        bootstrap=True,
    )


class MARLTask(CollectorTask):
    """Everything env-specific the trainer needs for a PettingZoo Parallel env."""

    minibatch_by = "step"

    def __init__(self, cfg: DictConfig, spec: EnvSpec, device: torch.device, collector: str = "episodes") -> None:
        self.cfg = cfg
        self.spec = spec
        self.device = device
        self.settings = marl_settings(cfg)
        self.env_kwargs = dict(cfg.env_kwargs or {})
        self.env_fn = functools.partial(spec.factory, **self.env_kwargs)
        probe = self.env_fn()
        if not hasattr(probe, "possible_agents") or not hasattr(probe, "step"):
            raise TypeError(f"env {spec.name!r} of kind pettingzoo did not build a PettingZoo env")
        from pettingzoo import AECEnv

        if isinstance(probe, AECEnv):
            from pettingzoo.utils.conversions import aec_to_parallel

            probe = aec_to_parallel(probe)
            self.env_fn = functools.partial(_aec_to_parallel_factory, self.env_fn)
        self.groups = AgentGroups.from_env(
            probe,
            override=self.settings["groups"],
            share=str(self.settings["share"]),
            agent_id=bool(self.settings["agent_id"]),
        )
        probe.close()
        self.state_dim = _state_dim(probe)
        a = cfg.algo
        if a.get("n_envs"):
            num_envs = int(a.n_envs)  # PPO baselines: independent episodes per update
        else:
            num_envs = int(cfg.vec.num_envs or 0) or int(a.get("num_groups", 1)) * int(a.get("group_size", 1))
        self.num_workers = resolve_workers(int(self.settings["num_workers"]), num_envs)
        self.vec = MarlVecEnv(self.env_fn, num_envs, num_workers=self.num_workers)
        p = cfg.policy
        self.policy = MultiAgentPolicy(
            self.groups, hidden=tuple(p.hidden), activation=str(p.activation), log_std_init=float(p.log_std_init)
        ).to(device)
        self.input_keys: tuple[str, ...] = ("obs", "actions", "agent")
        if any(s.has_action_mask for s in self.groups.specs.values()):
            self.input_keys += ("action_mask",)
        if collector not in COLLECTORS:
            raise ValueError(f"unknown multi-agent collector {collector!r}; registered: {sorted(COLLECTORS)}")
        self.collector = COLLECTORS[collector](self, cfg)
        self._eval_vec: MarlVecEnv | None = None
        self.last_eval: dict[str, float] = {}

    # -- trainer protocol --------------------------------------------------------------------
    @property
    def env_steps(self) -> int:
        return int(self.collector.total_env_steps)

    def set_env_steps(self, steps: int) -> None:
        self.collector.total_env_steps = int(steps)

    def collect(self, policy: MultiAgentPolicy) -> Batch:
        return self.collector.collect(policy)

    def log_prob(
        self, policy: MultiAgentPolicy, mb: dict[str, Tensor], need_entropy: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        obs, agent, actions = mb["obs"], mb["agent"], mb["actions"]
        lead = obs.shape[:-1]
        logp, ent = policy.log_prob(
            obs.reshape(-1, obs.shape[-1]),
            agent.reshape(-1),
            actions.reshape(-1, *actions.shape[len(lead) :]),
            None if "action_mask" not in mb else mb["action_mask"].reshape(-1, mb["action_mask"].shape[-1]),
        )
        logp, ent = logp.reshape(lead), ent.reshape(lead)
        return logp, ent if need_entropy else None

    def end_update(self, batch: Batch) -> None:
        """Nothing to refresh after an update (no observation normaliser here)."""

    def evaluate(self, policy: MultiAgentPolicy, episodes: int, seed_offset: int = 0) -> dict[str, float]:
        if self._eval_vec is None or self._eval_vec.num_envs != episodes:
            if self._eval_vec is not None:
                self._eval_vec.close()
            workers = resolve_workers(int(self.settings["num_workers"]), episodes)
            self._eval_vec = MarlVecEnv(self.env_fn, episodes, num_workers=workers)
        seeds = [1_000_000 + 1000 * int(self.cfg.seed) + seed_offset + i for i in range(episodes)]
        self.last_eval = evaluate_marl_policy(
            policy, self._eval_vec, seeds, self.device, deterministic=bool(self.cfg.eval.deterministic)
        )
        return self.last_eval

    def summary_extra(self) -> dict[str, Any]:
        """Per-group returns and the agent-groups, for summary.json."""
        per_group = {k.split("/", 2)[2]: v for k, v in self.last_eval.items() if k.startswith("eval/return_mean/")}
        per_agent = {k.split("/", 2)[2]: v for k, v in self.last_eval.items() if k.startswith("eval/agent_return/")}
        return {
            "return_unit": "mean per-agent episode return (env's own reward scale)",
            "per_group_return": per_group,
            "per_agent_return": per_agent,
            "agent_groups": self.groups.describe(),
            "group_mode": str(self.cfg.algo.get("group_mode", "")),
            "env_workers": self.num_workers,
        }


def _state_dim(env: Any) -> int:
    """Length of ``env.state()`` (0 when the env has no global state)."""
    space = getattr(env, "state_space", None)
    if space is None or getattr(space, "shape", None) is None:
        return 0
    size = 1
    for d in space.shape:
        size *= int(d)
    return size


def _aec_to_parallel_factory(base_fn: Callable[[], Any]) -> Any:
    """Registered factories may return AEC envs; the collector needs the Parallel API."""
    from pettingzoo.utils.conversions import aec_to_parallel

    return aec_to_parallel(base_fn())
