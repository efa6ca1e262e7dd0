"""Greedy and sampled actions of an :class:`~grpo_marl.policies.mlp.ActorPolicy` computed with numpy.

Why a second way to run the same network: the evaluation loop calls the actor once per vector
step on a few dozen rows (20 episodes by default), where the work is three small matrix products.
There, torch's per-operator dispatch costs several times the arithmetic, and alternating it with
the numpy env step evicts both from the CPU caches: in the CartPole evaluation loop one greedy
call took ~130 us through torch and ~29 us as numpy, and the env step itself fell from ~100 to
~72 us. Evaluations are a large share of a run evaluated as often as a benchmark does (20
episodes every few thousand env steps), so this is the difference between evaluation dominating a
CartPole run and not.

What it is not: a separate model. :meth:`HostActor.from_policy` copies the live parameters of
the policy's own modules at the start of each evaluation, and runs the same math in float32:
observation prefix -> optional running-norm -> optional agent-id one-hot -> the MLP's linear and
activation layers -> masked argmax (categorical) or the mean clipped to the action bounds
(Gaussian), exactly what ``ActorPolicy.act(deterministic=True)`` + ``to_env`` return. Anything it
does not cover (image encoders, activations without a numpy form, CUDA) returns ``None`` and the
loop uses torch. ``tests/test_host_policy.py`` checks both paths choose the same actions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from torch import nn

if TYPE_CHECKING:
    from grpo_marl.policies.mlp import ActorPolicy

_Fn = Callable[[np.ndarray], np.ndarray]


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _elu(alpha: float) -> _Fn:
    return lambda x: np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _activation(layer: nn.Module) -> _Fn | None:
    if type(layer) is nn.Tanh:
        return np.tanh
    if type(layer) is nn.ReLU:
        return lambda x: np.maximum(x, 0)
    if type(layer) is nn.SiLU:
        return _silu
    if type(layer) is nn.ELU:
        return _elu(float(layer.alpha))
    return None  # GELU needs erf, which numpy lacks: torch does it


@dataclass
class _Head:
    """One parameter set: which agents use it and its numpy layers."""

    slots: list[int]  # agent indices (columns of the [E, A, ...] layout)
    obs_dim: int
    norm: tuple[np.ndarray, np.ndarray, float] | None  # mean, std, clip
    one_hot: np.ndarray | None  # [len(slots), group size] agent-id columns
    layers: list[tuple[np.ndarray, np.ndarray] | _Fn]  # (W^T, b) or an activation
    bounds: tuple[np.ndarray, np.ndarray] | None  # Gaussian action bounds
    n_actions: int
    log_std: np.ndarray | None = None  # Gaussian heads
    gaussian_norm: np.float32 = np.float32(0)  # sum(log_std) + k/2 log(2 pi), as Actor._gaussian_norm

    def forward(self, x: np.ndarray) -> np.ndarray:
        for layer in self.layers:
            if type(layer) is tuple:
                w, b = layer
                x = x @ w
                x += b
            else:
                x = layer(x)  # type: ignore[operator]
        return x


class HostActor:
    """``obs[E, A, ...]`` (+ action mask) -> greedy env actions, as numpy; see the module docstring."""

    def __init__(self, heads: list[_Head], n_agents: int, kind: str, width: int) -> None:
        self.heads = heads
        self.n_agents = n_agents
        self.kind = kind
        self.width = width
        self._single = len(heads) == 1 and heads[0].slots == list(range(n_agents)) and heads[0].one_hot is None

    @classmethod
    def from_policy(cls, policy: ActorPolicy) -> HostActor | None:
        """A snapshot of ``policy``'s current parameters, or ``None`` where numpy cannot run it."""
        if policy._image or any(p.device.type != "cpu" for p in policy.parameters()):
            return None
        heads: list[_Head] = []
        for key in policy.keys:
            actor = policy.actors[key]
            layers: list[tuple[np.ndarray, np.ndarray] | _Fn] = []
            for layer in actor.net:
                if type(layer) is nn.Linear:
                    w = layer.weight.detach().numpy().T.astype(np.float32)  # contiguous after astype
                    b = (
                        layer.bias.detach().numpy().astype(np.float32)
                        if layer.bias is not None
                        else np.zeros(w.shape[1], np.float32)
                    )
                    layers.append((np.ascontiguousarray(w), b))
                else:
                    fn = _activation(layer)
                    if fn is None:
                        return None
                    layers.append(fn)
            norm = None
            if key in policy.norms:
                n = policy.norms[key]
                std = np.sqrt(n.var.detach().numpy() + n.eps).astype(np.float32)
                norm = (n.mean.detach().numpy().astype(np.float32), std, float(n.clip))
            slots = list(policy._slots[key])
            one_hot = None
            if policy.groups.agent_id:
                size = policy._group_size[key]
                one_hot = np.eye(size, dtype=np.float32)[policy.slot_in_group[slots].numpy()]
            head = _Head(slots, policy._obs_dim[key], norm, one_hot, layers, None, actor.out_dim)
            if actor.kind == "gaussian":
                assert actor.log_std is not None
                head.bounds = (actor.low.numpy().copy(), actor.high.numpy().copy())
                head.log_std = actor.log_std.detach().numpy().astype(np.float32)
                head.gaussian_norm = np.float32(actor._gaussian_norm().item())
            heads.append(head)
        return cls(heads, policy.n_agents, policy.kind, policy.action_width)

    def _outputs(self, obs: np.ndarray, action_mask: np.ndarray | None) -> list[tuple[_Head, np.ndarray]]:
        """Each head's output on its agents' rows: masked logits ``[E, a, n]`` or means ``[E, a, k]``."""
        e = obs.shape[0]
        outs = []
        for head in self.heads:
            x = obs[..., : head.obs_dim] if self._single else obs[:, head.slots, : head.obs_dim]
            x = np.asarray(x, np.float32)
            if head.norm is not None:
                mean, std, clip = head.norm
                x = np.clip((x - mean) / std, -clip, clip)
            if head.one_hot is not None:
                x = np.concatenate([x, np.broadcast_to(head.one_hot, (e, *head.one_hot.shape))], -1)
            y = head.forward(x)
            if head.bounds is None and action_mask is not None:
                m = action_mask if self._single else action_mask[:, head.slots]
                m = m[..., : y.shape[-1]]
                # as the torch path: masked-out logits -1e9; a row with no valid action keeps its logits
                y = np.where(m | ~m.any(-1, keepdims=True), y, np.float32(-1e9))
            outs.append((head, y))
        return outs

    def _empty_actions(self, e: int) -> np.ndarray:
        if self.kind == "categorical":
            return np.zeros((e, self.n_agents), np.int64)
        return np.zeros((e, self.n_agents, self.width), np.float32)

    def _put(self, out: np.ndarray, head: _Head, value: np.ndarray) -> np.ndarray:
        if self._single and (head.bounds is None or head.n_actions == self.width):
            return value
        if head.bounds is None:
            out[:, head.slots] = value
        else:
            out[:, head.slots, : head.n_actions] = value
        return out

    def greedy(self, obs: np.ndarray, action_mask: np.ndarray | None = None) -> np.ndarray:
        """Env actions of the mode: masked argmax, or the mean clipped to the action bounds."""
        out = self._empty_actions(obs.shape[0])
        for head, y in self._outputs(obs, action_mask):
            out = self._put(out, head, y.argmax(-1) if head.bounds is None else np.clip(y, *head.bounds))
        return out

    def sample(
        self, obs: np.ndarray, action_mask: np.ndarray | None, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions (Gaussian ones unclipped, as stored for the update) and their float32
        log-probs ``[E, A]``: ``ActorPolicy.act(deterministic=False)``'s math (Gumbel-max with
        ``-log E``, ``E ~ Exp(1)``; reparameterised normal) with ``rng``'s noise."""
        e = obs.shape[0]
        out = self._empty_actions(e)
        logp = np.zeros((e, self.n_agents), np.float32)
        for head, y in self._outputs(obs, action_mask):
            if head.bounds is None:
                z = y - y.max(-1, keepdims=True)
                logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
                noise = np.maximum(rng.standard_exponential(y.shape, dtype=np.float32), np.float32(1e-30))
                act = (logp_all - np.log(noise)).argmax(-1)
                lp = np.take_along_axis(logp_all, act[..., None], -1)[..., 0]
            else:
                assert head.log_std is not None
                eps = rng.standard_normal(y.shape, dtype=np.float32)
                act = y + np.exp(head.log_std) * eps
                lp = np.float32(-0.5) * np.square(eps).sum(-1) - head.gaussian_norm
            out = self._put(out, head, act)
            if self._single:
                logp = lp.astype(np.float32, copy=False)
            else:
                logp[:, head.slots] = lp
        return out, logp

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Sampled actions as the env takes them (Gaussian ones clipped to each agent's bounds)."""
        if self.kind == "categorical":
            return actions
        if self._single:
            return np.clip(actions, *self.heads[0].bounds)  # type: ignore[misc]
        out = actions.copy()
        for head in self.heads:
            out[:, head.slots, : head.n_actions] = np.clip(out[:, head.slots, : head.n_actions], *head.bounds)  # type: ignore[misc]
        return out
