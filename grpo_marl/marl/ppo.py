"""IPPO and MAPPO baselines for the multi-agent tasks (``algo=ippo`` / ``algo=mappo``).

They reuse everything GRPO uses — the trainer loop, the per-group actor, the multi-process
episode collector, the greedy evaluation — plus a critic and GAE(lambda), so a benchmark gap
isolates the advantage estimator (group baseline vs learned critic):

* **IPPO**: each agent's critic ``V(o_i)`` sees only its own observation;
* **MAPPO**: a centralized critic ``V(s, o_i, i)`` on the global ``env.state()`` (Yu et al. 2022),
  used only in training — the actors stay decentralized.

Details follow the MAPPO paper's MPE setup: on-policy batches of whole episodes from many envs,
the PPO clipped loss (``grpo_marl.losses.ppo.PPOLoss``), advantages normalized per minibatch, and
value normalization (the critic regresses returns standardized by running statistics, so that
its gradient does not swamp the actor's under the shared gradient-norm clip). A trajectory cut by
the env's time limit (mpe2's 25 steps: ``truncated``, not ``terminated``) or by the collection
horizon bootstraps from the critic's value of its final observation/state
(``r_T + gamma * V(s_{T+1})``) with ``algo.bootstrap_truncation=true`` — right for a
time-unaware critic when the limit is an artificial cutoff of a continuing task. The default is for
tasks whose score *is* the return within the limit (every shipped task; mpe2: 25 steps, no time in
the observation): ``algo.critic_time=true`` feeds the elapsed episode fraction to the critic
(training only) and the limit ends a time-aware finite-horizon task (Pardo et al. 2018)
(benchmarks/results/marl_simple_spread.md, MAPPO at 400k steps, lr 7e-4: -16.1 time-aware vs
-20.7 bootstrapped time-unaware vs -18.5 time-unaware terminal; -13.0 time-aware with lr 2e-3).
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from grpo_marl.advantages import gae
from grpo_marl.algos import register_algo
from grpo_marl.batch import Batch
from grpo_marl.losses import make_loss
from grpo_marl.marl.policy import MultiAgentCritic


class ValueNorm(nn.Module):
    """Running mean/variance of the value targets (MAPPO's ValueNorm without debiasing)."""

    def __init__(self, beta: float = 0.99999, eps: float = 1e-5) -> None:
        super().__init__()
        self.beta = beta
        self.eps = eps
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean_sq", torch.zeros((), dtype=torch.float64))
        self.register_buffer("weight", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        x = x.detach().to(torch.float64)
        # a weight that saturates at beta's horizon: early batches count fully (no debias step)
        w = self.weight * self.beta
        n = float(x.numel())
        self.mean.copy_((self.mean * w + x.sum()) / (w + n))
        self.mean_sq.copy_((self.mean_sq * w + x.square().sum()) / (w + n))
        self.weight.copy_(w + n)

    def std(self) -> Tensor:
        return (self.mean_sq - self.mean.square()).clamp(min=self.eps).sqrt()

    def normalize(self, x: Tensor) -> Tensor:
        return ((x - self.mean) / self.std()).to(x.dtype)

    def denormalize(self, x: Tensor) -> Tensor:
        return (x * self.std() + self.mean).to(x.dtype)


class MarlPPO:
    """Clipped PPO over agent trajectories with a per-group (IPPO) or centralized (MAPPO) critic."""

    name = "mappo"
    collector = "episodes_ppo"
    centralized = True

    def __init__(self, cfg: DictConfig, task: Any, device: torch.device) -> None:
        self.cfg = cfg
        self.task = task
        self.device = device
        hidden = tuple(cfg.value_hidden) if cfg.get("value_hidden") else tuple(task.cfg.policy.hidden)
        self.critic = MultiAgentCritic(
            task.groups,
            state_dim=task.state_dim if self.centralized else 0,
            centralized=self.centralized,
            hidden=hidden,
            activation=str(task.cfg.policy.activation),
            time_input=bool(cfg.get("critic_time", False)),
        ).to(device)
        self.bootstrap_truncation = bool(cfg.get("bootstrap_truncation", False))
        self.value_norm = ValueNorm().to(device) if cfg.get("value_norm", True) else None
        self.loss_fn = make_loss(
            "ppo",
            clip_eps=float(cfg.clip_eps),
            clip_vf=cfg.get("clip_vf"),
            vf_coef=float(cfg.vf_coef),
            entropy_coef=float(cfg.entropy_coef),
        )
        self.updates = 0

    def modules(self) -> dict[str, nn.Module]:
        """The critic (and its value statistics), trained and checkpointed with the policy."""
        out: dict[str, nn.Module] = {"critic": self.critic}
        if self.value_norm is not None:
            out["value_norm"] = self.value_norm
        return out

    def _values(self, data: dict[str, Tensor]) -> Tensor:
        """Raw critic output (normalized units when value_norm is on) for flat rows."""
        return self.critic(data["obs"], data["agent"], data.get("state"), data.get("time"))

    def collect(self) -> Batch:
        return self.task.collect(self.task.policy)

    @torch.no_grad()
    def prepare(self, batch: Batch) -> tuple[dict[str, Tensor], dict[str, float]]:
        """Critic values, GAE(lambda) per agent trajectory, flat valid steps for minibatching."""
        gamma, lam = float(self.cfg.gamma), float(self.cfg.gae_lambda)
        mask = batch.mask
        n, t = mask.shape
        flat_all = {k: batch[k].reshape(n * t, *batch[k].shape[2:]) for k in ("obs", "agent")}
        if self.centralized:
            flat_all["state"] = batch["state"].reshape(n * t, -1)
        # elapsed fraction of the episode (a critic input with critic_time: the value of a
        # fixed-horizon episode depends on the steps left, which the observations do not show)
        # (episodes start at step 0 in this collector; t = the longest collected episode)
        horizon = float(t)
        time = torch.arange(t, device=mask.device, dtype=torch.float32).expand(n, t) / horizon
        flat_all["time"] = time.reshape(n * t)
        raw = self._values(flat_all).reshape(n, t)
        values = self.value_norm.denormalize(raw) if self.value_norm is not None else raw
        values = torch.where(mask, values, torch.zeros_like(values))
        nxt = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1)
        dones = mask & ~nxt  # the last valid step of each agent trajectory ends it
        rewards = torch.where(mask, batch.rewards.float(), torch.zeros_like(values))
        if self.bootstrap_truncation and "truncated" in batch.data:
            # time-limit truncation is not termination: bootstrap from V(final obs / state)
            trunc = batch["truncated"].bool() & mask
            if trunc.any():
                nx = {"obs": batch["next_obs"][trunc], "agent": batch["agent"][trunc], "time": (time + 1.0 / horizon)[trunc]}
                if self.centralized:
                    nx["state"] = batch["next_state"][trunc]
                v_next = self._values(nx)
                if self.value_norm is not None:
                    v_next = self.value_norm.denormalize(v_next)
                rewards = rewards.index_put(torch.nonzero(trunc, as_tuple=True), rewards[trunc] + gamma * v_next)
        adv, returns = gae(rewards.T, values.T, dones.T, torch.zeros(n, device=values.device), gamma=gamma, lam=lam)
        adv, returns = adv.T, returns.T
        keys = list(self.task.input_keys) + ["logp"] + (["state"] if self.centralized else [])
        data = {k: batch[k][mask] for k in keys}
        data["time"] = time[mask]
        data["advantages"] = adv[mask].float()
        data["returns"] = returns[mask].float()
        data["old_values"] = raw[mask].float()
        if self.value_norm is not None:
            self.value_norm.update(data["returns"])
        v, r = values[mask], returns[mask]
        var_ret = r.var()
        metrics = {
            "train/value_mean": float(v.mean()),
            "train/explained_variance": float(1.0 - (r - v).var() / var_ret) if var_ret > 0 else 0.0,
            "train/advantage_abs_mean": float(data["advantages"].abs().mean()),
        }
        return data, metrics

    def loss(self, mb: dict[str, Tensor], weight_scale: float) -> dict[str, Tensor]:
        """Per-minibatch means (``weight_scale`` is for GRPO's weighted aggregation; unused)."""
        del weight_scale
        adv = mb["advantages"]
        if self.cfg.get("normalize_advantage", True) and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        logp, entropy = self.task.log_prob(self.task.policy, mb, need_entropy=True)
        values = self._values(mb)
        returns = mb["returns"]
        old_values = mb["old_values"]
        if self.value_norm is not None:
            returns = self.value_norm.normalize(returns)
        return self.loss_fn(logp, mb["logp"], adv, values, old_values, returns, entropy)

    def after_update(self) -> None:
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])


@register_algo("mappo")
class MAPPO(MarlPPO):
    """Centralized critic on ``env.state()`` (+ own observation and agent id)."""

    name = "mappo"
    centralized = True


@register_algo("ippo")
class IPPO(MarlPPO):
    """Independent critics on each agent's own observation."""

    name = "ippo"
    centralized = False
