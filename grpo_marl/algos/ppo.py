"""PPO — one implementation for single- and multi-agent envs; the critic is an option.

A fair baseline: GRPO and PPO share the trainer (optimizer, LR schedule, gradient clipping,
evaluation, checkpoints), the actor (:class:`~grpo_marl.policies.mlp.ActorPolicy`), the vector envs
and the evaluation loop, so benchmark differences isolate the advantage estimator (group baseline
vs learned critic). Data comes from the fixed-horizon step collector (``n_steps`` per env per
update, episodes streaming across updates, SB3/CleanRL style); rows are (env, agent) trajectories.

The critic options (``algo.*``) are what tell the named configs apart:

* ``ppo`` — Stable-Baselines3's PPO: critic on the agent's own observation, time-limit
  truncations bootstrap from ``V(final obs)`` folded into the reward (``bootstrap_truncation``),
  optional VecNormalize-style reward scaling (``normalize_reward``), linear clip schedule;
* ``ippo`` — the same critic per agent-group, with MAPPO's value normalisation (``value_norm``)
  and the elapsed episode fraction as a critic input (``critic_time``);
* ``mappo`` — additionally a centralized critic on the global ``env.state()`` plus the agent's id
  (``critic_state``), used only in training: the actors stay decentralized (Yu et al. 2022).

With ``critic_time`` the episode limit ends a time-aware finite-horizon task (Pardo et al. 2018):
every shipped multi-agent task scores the return within its limit (mpe2: 25 steps, no time in the
observation), where this beat bootstrapping a time-unaware critic (MAPPO on simple_spread at 400k
steps: -16.1 time-aware vs -20.7 bootstrapped, lr 7e-4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from grpo_marl.advantages import gae
from grpo_marl.algos import Algorithm, register_algo
from grpo_marl.batch import Batch
from grpo_marl.losses import make_loss
from grpo_marl.policies.mlp import ActorPolicy, Critic
from grpo_marl.settings import PPOSettings

if TYPE_CHECKING:
    from grpo_marl.tasks.control import ControlTask


class ValueNorm(nn.Module):
    """Running mean/variance of the value targets (MAPPO's ValueNorm without debiasing)."""

    mean: Tensor
    mean_sq: Tensor
    weight: Tensor

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
class PPO(Algorithm[ActorPolicy, ActorPolicy]):
    """Clipped PPO with a learned critic (options in the module docstring)."""

    collector: ClassVar[str] = "steps"
    split_keys: ClassVar[tuple[str, ...]] = ("algo.n_envs", "vec.num_envs")
    settings = PPOSettings
    #: PPO trains control envs: its critic reads the actor's preprocessing and the vector env's layout
    task: ControlTask

    @classmethod
    def needs_state(cls, cfg: DictConfig) -> bool:
        return bool(cfg.algo.critic_state)

    @classmethod
    def derive_sizes(cls, cfg: DictConfig) -> None:
        """``n_envs`` streams of ``n_steps`` per update, split into minibatches of about
        ``batch_size`` rows (SB3's convention) unless ``algo.minibatches`` is set."""
        if not cfg.vec.num_envs:
            cfg.vec.num_envs = int(cfg.algo.n_envs)
        if not cfg.algo.minibatches:
            steps = int(cfg.algo.n_envs) * int(cfg.algo.n_steps)
            cfg.algo.minibatches = max(1, steps // max(int(cfg.algo.batch_size), 1))

    def __init__(self, cfg: DictConfig, task: ControlTask, device: torch.device) -> None:
        super().__init__(cfg, task, device)
        policy = task.policy
        run = task.cfg
        hidden = tuple(cfg.value_hidden) if cfg.value_hidden else tuple(run.policy.hidden)
        self.use_state = bool(cfg.critic_state)
        self.critic = Critic(
            policy,
            state_dim=task.vec.layout.state_dim if self.use_state else 0,
            hidden=hidden,
            activation=str(run.policy.activation),
            time_input=bool(cfg.critic_time),
        ).to(device)
        self.value_norm = ValueNorm().to(device) if cfg.value_norm else None
        self.bootstrap_truncation = bool(cfg.bootstrap_truncation)
        self.loss_fn = make_loss(
            "ppo",
            clip_eps=float(cfg.clip_eps),
            clip_vf=cfg.clip_vf,
            vf_coef=float(cfg.vf_coef),
            entropy_coef=float(cfg.entropy_coef),
        )
        rows = task.vec.num_envs * task.vec.layout.num_agents
        self.reward_scale = RunningReturnScale(rows, float(cfg.gamma)) if cfg.normalize_reward else None
        self.clip_now = float(cfg.clip_eps)

    def modules(self) -> dict[str, nn.Module]:
        """The critic (and its value statistics), trained and checkpointed with the policy."""
        out: dict[str, nn.Module] = {"critic": self.critic}
        if self.value_norm is not None:
            out["value_norm"] = self.value_norm
        return out

    def values(self, obs: Tensor, agent: Tensor, state: Tensor | None, time: Tensor | None) -> Tensor:
        """Critic values of flat rows in return units (value normalisation undone)."""
        raw = self.critic(self.task.policy, obs, agent, state, time)
        return self.value_norm.denormalize(raw) if self.value_norm is not None else raw

    def clip_range(self) -> float:
        """Current ratio clip: constant, or linear to 0 over ``total_steps`` (rl-zoo ``lin_``)."""
        eps = float(self.cfg.clip_eps)
        if self.cfg.clip_schedule == "linear":
            total = max(int(self.task.cfg.total_steps), 1)
            eps *= max(1.0 - min(1.0, self.task.env_steps / total), 0.0)
        return max(eps, 1e-8)

    @torch.no_grad()
    def prepare(self, batch: Batch) -> tuple[dict[str, Tensor] | None, dict[str, float]]:
        """Values, truncation bootstrapping and GAE(lambda) per row; flat valid steps."""
        gamma, lam = float(self.cfg.gamma), float(self.cfg.gae_lambda)
        mask = batch.mask
        n, t = mask.shape
        term, trunc = batch["terminated"], batch["truncated"]
        rewards = batch.rewards.float()
        if self.reward_scale is not None:
            dones_np = (term | trunc).cpu().numpy()
            rewards = torch.as_tensor(self.reward_scale(rewards.cpu().numpy(), dones_np), device=self.device)
        state = batch["state"] if self.use_state else None

        def flat(x: Tensor) -> Tensor:
            return x.reshape(n * t, *x.shape[2:])

        values = self.values(
            flat(batch["obs"]), flat(batch["agent"]), None if state is None else flat(state), flat(batch["time"])
        ).reshape(n, t)
        values = torch.where(mask, values, torch.zeros_like(values))
        boot = trunc & ~term & mask
        if self.bootstrap_truncation and bool(boot.any()):
            # SB3: a time-limit cut is not a real end; credit the reward with gamma * V(last real obs).
            rewards = rewards.clone()
            final_state = batch["final_state"][boot] if self.use_state else None
            rewards[boot] += gamma * self.values(
                batch["final_obs"][boot], batch["agent"][boot], final_state, torch.ones_like(rewards[boot])
            )
        last = self.values(
            batch["next_obs"],
            batch["agent"][:, -1],
            batch["next_state"] if self.use_state else None,
            batch["next_time"],
        )
        adv, returns = gae(rewards.T, values.T, (term | trunc | ~mask).T, last, gamma=gamma, lam=lam)
        adv, returns = adv.T.float(), returns.T.float()
        keys = list(self.task.input_keys) + ["logp", "time"] + (["state"] if self.use_state else [])
        data = {k: batch[k][mask] for k in keys}
        data["advantages"] = adv[mask]
        data["returns"] = returns[mask]
        v = values[mask]
        data["old_values"] = self.value_norm.normalize(v) if self.value_norm is not None else v
        if self.value_norm is not None:
            self.value_norm.update(data["returns"])
        self.clip_now = self.clip_range()
        r = data["returns"]
        var_ret = r.var()
        metrics = {
            "train/value_mean": float(v.mean()),
            "train/explained_variance": float(1.0 - (r - v).var() / var_ret) if var_ret > 0 else 0.0,
            "train/advantage_abs_mean": float(data["advantages"].abs().mean()),
            "train/clip_range": self.clip_now,
        }
        return data, metrics

    def loss(self, mb: dict[str, Tensor]) -> dict[str, Tensor]:
        """Per-minibatch means, advantages normalised per minibatch (SB3/MAPPO)."""
        adv = mb["advantages"]
        if self.cfg.normalize_advantage and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        logp, entropy = self.task.log_prob(self.task.policy, mb, need_entropy=True)
        values = self.critic(self.task.policy, mb["obs"], mb["agent"], mb.get("state"), mb["time"])
        returns = mb["returns"]
        if self.value_norm is not None:
            returns = self.value_norm.normalize(returns)
        return self.loss_fn(logp, mb["logp"], adv, values, mb["old_values"], returns, entropy, clip_eps=self.clip_now)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {**super().state_dict(), "clip_now": self.clip_now}
        if self.reward_scale is not None:
            state["reward_scale"] = self.reward_scale.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.clip_now = float(state.get("clip_now", self.clip_now))
        if self.reward_scale is not None and "reward_scale" in state:
            self.reward_scale.load_state_dict(state["reward_scale"])


# MAPPO and IPPO are PPO under other names: their config files (conf/algo/) set the critic options.
register_algo("mappo")(PPO)
register_algo("ippo")(PPO)
