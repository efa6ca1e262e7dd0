"""MLP actors for Gymnasium spaces: categorical for ``Discrete``, Gaussian for ``Box``.

Sampling is written out by hand (Gumbel-max for categorical, reparameterised normal for Gaussian)
instead of building ``torch.distributions`` objects, because the collector calls ``act`` once per
vector step and distribution construction would dominate the hot loop on small networks.
"""

from __future__ import annotations

import math
from typing import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

_LOG_2PI = math.log(2 * math.pi)


class UnsupportedSpaceError(ValueError):
    """The policy cannot represent this observation or action space."""


def _activation(name: str) -> type[nn.Module]:
    table = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU}
    if name not in table:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(table)}")
    return table[name]


def mlp(sizes: Sequence[int], activation: str, out_gain: float = 1.0) -> nn.Sequential:
    """Orthogonally initialised MLP (CleanRL/SB3 init: sqrt(2) hidden gain, small output gain)."""
    act = _activation(activation)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        linear = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, gain=out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(act())
    return nn.Sequential(*layers)


class RunningNorm(nn.Module):
    """Running mean/variance observation normaliser (Welford over batches), saved in state_dict."""

    def __init__(self, shape: Sequence[int], clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(*shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(*shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(eps, dtype=torch.float64))
        self.clip = clip
        self.eps = eps

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean += delta * n / total
        m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: Tensor) -> Tensor:
        std = torch.sqrt(self.var + self.eps).to(x.dtype)
        return ((x - self.mean.to(x.dtype)) / std).clamp(-self.clip, self.clip)


def flat_obs_dim(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    raise UnsupportedSpaceError(
        f"observation space {space} is not supported by the MLP policy (Box or Discrete only); "
        "wrap the env with gymnasium.wrappers.FlattenObservation or register a custom policy"
    )


class MLPPolicy(nn.Module):
    """Stochastic actor over a flat observation.

    Box actions: a diagonal Gaussian with a state-independent log-std; samples are clipped to the
    action bounds when sent to the env (``to_env``) while log-probs use the unclipped sample, as
    in SB3/CleanRL, so the surrogate ratio stays exact.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
        normalize_obs: bool = False,
        extra_inputs: int = 0,
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.obs_dim = flat_obs_dim(observation_space)
        self.discrete_obs = isinstance(observation_space, gym.spaces.Discrete)
        in_dim = self.obs_dim + extra_inputs
        self.obs_norm = RunningNorm((self.obs_dim,)) if normalize_obs else None
        if isinstance(action_space, gym.spaces.Discrete):
            self.kind = "categorical"
            self.n_actions = int(action_space.n)
            self.net = mlp([in_dim, *hidden, self.n_actions], activation, out_gain=0.01)
            self.log_std = None
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
                raise UnsupportedSpaceError(
                    f"Box action space {action_space} must have finite bounds for the Gaussian policy"
                )
            self.kind = "gaussian"
            self.act_dim = int(action_space.shape[0])
            self.net = mlp([in_dim, *hidden, self.act_dim], activation, out_gain=0.01)
            self.log_std = nn.Parameter(torch.full((self.act_dim,), float(log_std_init)))
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))
        else:
            raise UnsupportedSpaceError(
                f"action space {action_space} is not supported by the MLP policy; supported: "
                "Discrete (categorical) and 1-D Box with finite bounds (Gaussian)"
            )

    # -- helpers ---------------------------------------------------------------------------
    def preprocess(self, obs: Tensor) -> Tensor:
        if self.discrete_obs:
            return torch.nn.functional.one_hot(obs.long(), self.obs_dim).float()
        obs = obs.reshape(*obs.shape[: obs.dim() - len(self.observation_space.shape)], -1).float()
        return self.obs_norm(obs) if self.obs_norm is not None else obs

    def forward(self, obs: Tensor) -> Tensor:
        """Logits (categorical) or action means (Gaussian)."""
        return self.net(self.preprocess(obs))

    # -- acting ----------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """Sample (or take the mode of) an action; returns ``(action, log_prob)``."""
        out = self.forward(obs)
        if self.kind == "categorical":
            logp_all = torch.log_softmax(out, dim=-1)
            if deterministic:
                action = out.argmax(-1)
            else:
                gumbel = -torch.log(-torch.log(torch.rand_like(out).clamp_(1e-20, 1.0)))
                action = (logp_all + gumbel).argmax(-1)
            return action, logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        std = self.log_std.exp()
        action = out if deterministic else out + std * torch.randn_like(out)
        return action, self._gaussian_logp(out, action)

    def _gaussian_logp(self, mean: Tensor, action: Tensor) -> Tensor:
        z = (action - mean) / self.log_std.exp()
        return (-0.5 * z.square() - self.log_std - 0.5 * _LOG_2PI).sum(-1)

    def log_prob(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """Differentiable ``(log_prob, entropy)`` of given actions, used by the losses."""
        out = self.forward(obs)
        if self.kind == "categorical":
            logp_all = torch.log_softmax(out, dim=-1)
            logp = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            return logp, entropy
        logp = self._gaussian_logp(out, action)
        entropy = (0.5 + 0.5 * _LOG_2PI + self.log_std).sum().expand(logp.shape)
        return logp, entropy

    def to_env(self, action: Tensor) -> np.ndarray:
        """Convert a sampled action to what ``env.step`` accepts (clipped to Box bounds)."""
        if self.kind == "categorical":
            return action.cpu().numpy()
        return torch.max(torch.min(action, self.high), self.low).cpu().numpy()

    def action_shape(self) -> tuple[int, ...]:
        return () if self.kind == "categorical" else (self.act_dim,)
