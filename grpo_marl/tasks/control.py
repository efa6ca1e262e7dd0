"""The Task of every control env — Gymnasium (one agent) and PettingZoo (many) alike:
vector env -> actor policy -> collector, plus evaluation.

Rollout rows are (env, agent) trajectories; ``algo.group_mode`` picks which of them GRPO compares
(see :mod:`grpo_marl.groups`). Env steps are *joint* steps (one step of one env, whatever its
number of agents); returns are mean per-agent episode returns on the env's own reward scale.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from grpo_marl.batch import Batch
from grpo_marl.collectors import evaluate_policy, make_collector
from grpo_marl.collectors.base import rollout_storage_bytes
from grpo_marl.errors import UserInputError
from grpo_marl.families import get_family
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.base import ActingPolicy, Policy
from grpo_marl.policies.cnn import resolve_encoder
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import EnvSpec
from grpo_marl.tasks.base import Task
from grpo_marl.vec import VecEnv, make_vec_env


def marl_settings(cfg: DictConfig) -> dict[str, Any]:
    """The ``marl`` config section as a plain dict (its keys and defaults: grpo_marl.settings)."""
    section = OmegaConf.to_container(cfg.marl, resolve=True)
    assert isinstance(section, dict)
    return {str(k): v for k, v in section.items()}


def num_envs_of(cfg: DictConfig) -> int:
    """Vector width: ``vec.num_envs``, which the algorithm derives when the user left it 0
    (:meth:`grpo_marl.algos.Algorithm.derive_sizes`, run when the config is resolved)."""
    if not cfg.vec.num_envs:
        raise UserInputError(
            f"vec.num_envs=0 and algo={cfg.algo.name} derives no vector width; set vec.num_envs=<envs>"
        )
    return int(cfg.vec.num_envs)


def with_preprocessing(spec: EnvSpec, cfg: DictConfig) -> EnvSpec:
    """A PettingZoo env of the butterfly/sisl families, or with ``env_preprocess`` set: the spec
    whose factory applies SuperSuit preprocessing (:mod:`grpo_marl.marl.preprocess`). Other envs
    (and the batched ports, which never call the factory) are returned unchanged. The PettingZoo
    family's :meth:`~grpo_marl.families.EnvFamily.prepare_spec`."""
    from grpo_marl.marl import preprocess

    section = OmegaConf.to_container(cfg.env_preprocess, resolve=True)
    settings = preprocess.settings_of(section)  # type: ignore[arg-type]
    if not preprocess.is_active(settings) and preprocess.family_of(spec.name) not in preprocess.FAMILY_MODULES:
        return spec
    if spec.factory is None:  # a vector factory only: no per-env factory to wrap
        return spec
    return dataclasses.replace(spec, factory=preprocess.wrap_factory(spec.factory, settings, spec.name))


def memory_budget_bytes() -> int:
    """Half the memory available now (``MemAvailable``, else free pages from ``os.sysconf``);
    ``GRPO_MARL_STORAGE_BUDGET_MB`` overrides it."""
    forced = os.environ.get("GRPO_MARL_STORAGE_BUDGET_MB")
    if forced:
        return int(float(forced) * 2**20)
    avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if not avail:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return 2**62
    return avail // 2


def check_storage(cfg: DictConfig, vec: VecEnv, collector: Any, policy: ActorPolicy) -> dict[str, int]:
    """Print the rollout storage of image envs and refuse (exit 2) a run whose estimated peak
    would not fit the memory budget, naming the keys that shrink it."""
    # rows of one update (every env and agent over the collector's horizon; an env without an
    # episode limit is guessed at 64 steps), split in the algorithm's minibatches
    sizes = collector.update_steps()
    steps = sizes[0] if sizes is not None else 64 * vec.num_envs
    minibatches = OmegaConf.select(cfg, "algo.minibatches")  # an algorithm's section may have none
    mb_rows = None
    if isinstance(minibatches, int) and minibatches > 0:
        mb_rows = steps * vec.layout.num_agents // minibatches
    est = rollout_storage_bytes(collector, policy, mb_rows)
    if est["peak"] == 0:
        return est
    est["budget"] = memory_budget_bytes()
    lay = vec.layout
    mib = 2**20
    if lay.is_image:
        print(
            f"rollout storage: obs {np.dtype(lay.obs_dtype).name}{list(lay.obs_shape)} x {est['horizon']} steps x "
            f"{vec.num_envs} envs x {lay.num_agents} agents = {est['storage'] / mib:.0f} MiB; "
            f"estimated peak {est['peak'] / mib:.0f} MiB (budget {est['budget'] / mib:.0f} MiB)",
            flush=True,
        )
    if est["peak"] > est["budget"]:
        width = (
            "algo.n_envs / vec.num_envs, algo.n_steps"
            if hasattr(collector, "n_steps")
            else "algo.num_groups / algo.group_size (vec.num_envs), vec.max_steps"
        )
        raise UserInputError(
            f"the rollout storage of env {cfg.env!r} would need about {est['peak'] / mib:.0f} MiB "
            f"(obs {list(lay.obs_shape)} x {est['horizon']} steps x {vec.num_envs} envs x {lay.num_agents} agents), "
            f"over the budget of {est['budget'] / mib:.0f} MiB (half the available memory); lower {width}"
            + (", env_preprocess.resize or env_preprocess.frame_stack" if lay.is_image else "")
            + (", or raise algo.minibatches" if lay.is_image else "")
        )
    return est


class ControlTask(Task[ActorPolicy, ActorPolicy]):
    """Everything env-specific the trainer needs for a Gymnasium or PettingZoo env."""

    def __init__(
        self,
        cfg: DictConfig,
        spec: EnvSpec,
        device: torch.device,
        collector: str = "episodes",
        with_state: bool = False,
    ) -> None:
        self.cfg = cfg
        self.spec = get_family(spec.kind).prepare_spec(spec, cfg)
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
            obs_shape=self.vec.layout.obs_shape if self.vec.layout.is_image else None,
            encoder=resolve_encoder(str(p.encoder), self.vec.layout.is_image),
        ).to(device)
        self.input_keys: tuple[str, ...] = ("obs", "actions", "agent")
        if self.vec.layout.has_action_mask:
            self.input_keys += ("action_mask",)
        self.collector = make_collector(collector, self.vec, self.groups, cfg, device)
        self._eval_vec: VecEnv | None = None
        self.last_eval: dict[str, float] = {}
        try:
            self.storage = check_storage(cfg, self.vec, self.collector, self.policy)
        except UserInputError:
            self.close()
            raise

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
    def update_steps(self) -> tuple[int, str, bool] | None:
        return self.collector.update_steps()

    def collect(self, policy: Policy) -> Batch:
        return self.collector.collect(policy)

    def log_prob(
        self,
        policy: Policy,
        mb: dict[str, Tensor],
        need_entropy: bool = True,
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
        # The actor computes the entropy in the same forward: without a bonus it is still returned,
        # detached (no backward through it), so train/entropy reports the policy's real entropy.
        return logp, ent if need_entropy else ent.detach()

    def end_update(self, batch: Batch) -> None:
        """Update observation statistics *after* the update, so old and new log-probs of this
        batch were computed with the same normaliser (the surrogate ratio stays exact)."""
        m = batch.mask
        self.policy.update_obs_stats(batch["obs"][m], batch["agent"][m])

    def evaluate(self, policy: ActingPolicy, episodes: int, seed_offset: int = 0) -> dict[str, float]:
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
            "group_mode": str(OmegaConf.select(self.cfg, "algo.group_mode", default="")),
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
