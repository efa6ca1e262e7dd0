"""PPO baseline: the same actor and vector envs as GRPO, plus a value network and GAE(lambda).

The point of this module is a *fair* comparison: GRPO and PPO share the trainer (optimizer, LR
schedule, gradient clipping, evaluation, checkpoints), the actor (:class:`MLPPolicy`), the vector
envs and the greedy evaluation, so benchmark differences isolate the advantage estimator (group
baseline vs learned critic). The details follow Stable-Baselines3's PPO, so that our PPO with
rl-baselines3-zoo hyperparameters is step-for-step comparable with SB3's:

- a streaming fixed-horizon collector (``grpo_marl.rollout_steps``, ``n_steps`` per env per update);
- truncated episodes bootstrap from ``V(final_obs)`` folded into the last reward (SB3);
- advantages normalized per minibatch; mean losses per minibatch; a shared Adam optimizer;
- optional value clipping, entropy bonus, linear clip-range schedule, and VecNormalize-style
  reward scaling by the running std of the discounted return (rl-zoo's ``normalize: true``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

import grpo_marl.rollout_steps  # noqa: F401  (registers the "steps" collector)
from grpo_marl.advantages import gae
from grpo_marl.algos import register_algo
from grpo_marl.batch import Batch
from grpo_marl.config import _choice, _positive, register_validator
from grpo_marl.losses import make_loss
from grpo_marl.policies.mlp import mlp


class ValueNet(nn.Module):
    """State-value MLP on the actor's *preprocessed* observation (same one-hot / running norm)."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], activation: str) -> None:
        super().__init__()
        self.net = mlp([in_dim, *hidden, 1], activation, out_gain=1.0)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(-1)


class RunningReturnScale:
    """VecNormalize's reward scaling: divide rewards by the running std of the discounted return.

    Kept per env (``ret`` accumulates ``gamma * ret + r`` and resets at episode ends) so it streams
    across updates exactly like SB3's wrapper; its state is part of the algorithm's checkpoint.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.gamma = gamma
        self.clip = clip
        self.eps = eps
        self.ret = np.zeros(num_envs, dtype=np.float64)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def _update(self, x: np.ndarray) -> None:
        batch_mean, batch_var, n = float(x.mean()), float(x.var()), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean += delta * n / total
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.var = m2 / total
        self.count = total

    def __call__(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        """``rewards``/``dones`` are ``[N, T]``; returns scaled rewards, step by step in time."""
        out = np.empty_like(rewards, dtype=np.float32)
        for t in range(rewards.shape[1]):
            self.ret = self.ret * self.gamma + rewards[:, t]
            self._update(self.ret)
            out[:, t] = np.clip(rewards[:, t] / np.sqrt(self.var + self.eps), -self.clip, self.clip)
            self.ret[dones[:, t]] = 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"ret": self.ret.copy(), "mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ret = np.asarray(state["ret"], dtype=np.float64)
        # A resume with another number of torchrun ranks changes the envs per rank: the running
        # statistics carry over, the per-env return accumulators restart (as the envs do).
        self.ret = ret.copy() if ret.shape == self.ret.shape else np.zeros_like(self.ret)
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


@register_algo("ppo")
class PPO:
    """Clipped PPO with a separate value network. ``cfg`` is the ``algo`` config section."""

    name = "ppo"
    collector = "steps"

    def __init__(self, cfg: DictConfig, task: Any, device: torch.device) -> None:
        self.cfg = cfg
        self.task = task
        self.device = device
        policy = task.policy
        hidden = tuple(cfg.value_hidden) if cfg.get("value_hidden") else tuple(task.cfg.policy.hidden)
        in_dim = policy.net[0].in_features
        self.value_net = ValueNet(in_dim, hidden, str(task.cfg.policy.activation)).to(device)
        self.loss_fn = make_loss(
            "ppo",
            clip_eps=float(cfg.clip_eps),
            clip_vf=cfg.clip_vf,
            vf_coef=float(cfg.vf_coef),
            entropy_coef=float(cfg.entropy_coef),
        )
        self.reward_scale = (
            RunningReturnScale(task.vec.num_envs, float(cfg.gamma)) if cfg.normalize_reward else None
        )
        self.clip_now = float(cfg.clip_eps)
        self.updates = 0

    # -- trainable state ---------------------------------------------------------------------
    def modules(self) -> dict[str, nn.Module]:
        """The critic: the trainer optimizes and checkpoints it alongside the policy."""
        return {"value": self.value_net}

    def values(self, obs: Tensor) -> Tensor:
        return self.value_net(self.task.policy.preprocess(obs))

    # -- data ------------------------------------------------------------------------------
    def collect(self) -> Batch:
        return self.task.collect(self.task.policy)

    def clip_range(self) -> float:
        """Current ratio clip: constant, or linear to 0 over ``total_steps`` (rl-zoo ``lin_``)."""
        eps = float(self.cfg.clip_eps)
        if self.cfg.clip_schedule == "linear":
            progress = min(1.0, self.task.env_steps / max(int(self.task.cfg.total_steps), 1))
            eps *= max(1.0 - progress, 0.0)
        return max(eps, 1e-8)

    @torch.no_grad()
    def prepare(self, batch: Batch) -> tuple[dict[str, Tensor], dict[str, float]]:
        """Values, truncation bootstrapping and GAE(lambda); flat step data for minibatching."""
        gamma, lam = float(self.cfg.gamma), float(self.cfg.gae_lambda)
        obs = batch["obs"]
        n, t = batch.mask.shape
        term, trunc = batch["terminated"], batch["truncated"]
        rewards = batch.rewards.float()
        if self.reward_scale is not None:
            dones_np = (term | trunc).cpu().numpy()
            rewards = torch.as_tensor(self.reward_scale(rewards.cpu().numpy(), dones_np), device=self.device)
        values = self.values(obs.reshape(n * t, *obs.shape[2:])).reshape(n, t)
        # SB3: a time-limit cut is not a real end; credit the reward with gamma * V(last real obs).
        boot = trunc & ~term
        if bool(boot.any()):
            rewards = rewards.clone()
            rewards[boot] += gamma * self.values(batch["final_obs"][boot])
        last_values = self.values(batch["next_obs"])
        adv, returns = gae(
            rewards.T, values.T, (term | trunc).T, last_values, gamma=gamma, lam=lam
        )
        adv, returns = adv.T.float(), returns.T.float()
        flat = lambda x: x.reshape(n * t, *x.shape[2:])  # noqa: E731
        data = {
            "obs": flat(obs),
            "actions": flat(batch["actions"]),
            "logp": flat(batch["logp"]),
            "advantages": flat(adv),
            "returns": flat(returns),
            "old_values": flat(values),
        }
        self.clip_now = self.clip_range()
        var_ret = returns.var()
        metrics = {
            "train/value_mean": float(values.mean()),
            "train/explained_variance": float(1.0 - (returns - values).var() / var_ret) if var_ret > 0 else 0.0,
            "train/advantage_abs_mean": float(adv.abs().mean()),
            "train/clip_range": self.clip_now,
        }
        return data, metrics

    # -- loss ------------------------------------------------------------------------------
    def loss(self, mb: dict[str, Tensor], weight_scale: float) -> dict[str, Tensor]:
        """Per-minibatch means (``weight_scale`` is for weighted GRPO aggregation; unused)."""
        del weight_scale
        adv = mb["advantages"]
        if self.cfg.normalize_advantage and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        logp, entropy = self.task.log_prob(self.task.policy, mb, need_entropy=True)
        values = self.values(mb["obs"])
        return self.loss_fn(
            logp, mb["logp"], adv, values, mb["old_values"], mb["returns"], entropy, clip_eps=self.clip_now
        )

    def after_update(self) -> None:
        self.updates += 1

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"updates": self.updates, "clip_now": self.clip_now}
        if self.reward_scale is not None:
            state["reward_scale"] = self.reward_scale.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = state["updates"]
        self.clip_now = state["clip_now"]
        if self.reward_scale is not None and "reward_scale" in state:
            self.reward_scale.load_state_dict(state["reward_scale"])


@register_validator
def _validate_ppo(cfg: DictConfig) -> list[str]:
    """Checks with actionable messages for the ``algo=ppo`` section."""
    if cfg.algo.name != "ppo":
        return []
    a = cfg.algo
    kind = cfg.get("env_kind", "gymnasium")
    if kind == "pettingzoo":
        return []  # the multi-agent validator says to use algo=mappo or algo=ippo
    if kind != "gymnasium":
        return [f"algo=ppo supports single-agent Gymnasium envs only (env {cfg.env!r} is {kind})"]
    errors: list[str] = []
    for key in ("n_envs", "n_steps", "batch_size", "epochs", "minibatches"):
        _positive(errors, cfg, f"algo.{key}", integer=True)
    for key in ("lr", "clip_eps"):
        _positive(errors, cfg, f"algo.{key}")
    for key in ("vf_coef", "entropy_coef", "max_grad_norm"):
        _positive(errors, cfg, f"algo.{key}", strict=False)
    if a.clip_vf is not None:
        _positive(errors, cfg, "algo.clip_vf", strict=False)
    if isinstance(a.clip_eps, (int, float)) and a.clip_eps >= 1:
        errors.append(f"algo.clip_eps={a.clip_eps} must be < 1 (ratios are clipped to [1-eps, 1+eps])")
    for key in ("gamma", "gae_lambda"):
        value = a[key]
        if not isinstance(value, (int, float)) or not 0 <= value <= 1:
            errors.append(f"algo.{key}={value!r} must be in [0, 1]")
    _choice(errors, cfg, "algo.lr_schedule", ("constant", "linear", "cosine"))
    _choice(errors, cfg, "algo.clip_schedule", ("constant", "linear"))
    if cfg.vec.num_envs and a.n_envs and int(cfg.vec.num_envs) != int(a.n_envs):
        errors.append(
            f"vec.num_envs={cfg.vec.num_envs} disagrees with algo.n_envs={a.n_envs}; set algo.n_envs "
            "only (vec.num_envs is derived from it for PPO)"
        )
    if isinstance(a.n_envs, int) and isinstance(a.n_steps, int) and isinstance(a.minibatches, int):
        if a.minibatches > a.n_envs * a.n_steps:
            errors.append(
                f"algo.minibatches={a.minibatches} exceeds the {a.n_envs * a.n_steps} steps per update "
                "(n_envs * n_steps); raise algo.batch_size or lower algo.minibatches"
            )
    return errors
