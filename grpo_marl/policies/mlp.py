"""The actor of every control task: per-agent-group MLPs over the ``[E, A, ...]`` layout.

One family for single- and multi-agent envs: a Gymnasium env is one agent in one group. Discrete
actions use (masked) categoricals, Box actions a diagonal Gaussian with a state-independent
log-std. Parameters are shared within an agent-group (``marl.share=group``) or held per agent
(``share=agent``); each parameter set reads only its own observation prefix (plus an optional
agent-id one-hot), so padded heterogeneous agents (speaker/listener) never see each other's padding.

Image observations (``uint8[H, W, C]``, see :mod:`grpo_marl.vec.base`) go through an encoder
first (``policy.encoder``: ``cnn`` = the Nature-CNN of :mod:`grpo_marl.policies.cnn`, one per
parameter set; ``mlp`` = flattened and scaled to [0, 1]); the head MLP sits on its features. The
vector path is unchanged (one flag check per call).

Sampling is written out by hand (Gumbel-max for categorical, reparameterised normal for Gaussian)
instead of building ``torch.distributions`` objects, because the collector calls ``act`` once per
vector step and distribution construction would dominate the hot loop on small networks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar, cast

import numpy as np
import torch
from torch import Tensor, nn

from grpo_marl.errors import UnsupportedSpaceError, UserInputError
from grpo_marl.groups import AgentGroups

if TYPE_CHECKING:
    from grpo_marl.policies.host import HostActor

_LOG_2PI = math.log(2 * math.pi)

M = TypeVar("M", bound=nn.Module)


class ModuleMap(nn.ModuleDict, Generic[M]):
    """An ``nn.ModuleDict`` whose values are one module type, so ``policy.actors[key].log_std``
    type-checks (``nn.Module.__getattr__`` would otherwise make every attribute
    ``Tensor | Module``). Same state-dict keys as a plain ``ModuleDict``."""

    def __getitem__(self, key: str) -> M:
        return cast(M, super().__getitem__(key))

    def values(self) -> Iterator[M]:  # type: ignore[override]
        return (cast(M, m) for m in super().values())


def _activation(name: str) -> type[nn.Module]:
    table = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU}
    if name not in table:
        raise UserInputError(f"policy.activation={name!r} is unknown; choose one of {sorted(table)}")
    return table[name]


class MLP(nn.Sequential):
    """``nn.Sequential`` of linear and activation layers whose forward runs a cached list of
    plain tensor functions instead of calling each layer through ``Module.__call__``.

    Same parameters, state-dict keys and math. On the CPU the per-module call machinery (hook
    checks, ``__call__`` dispatch, the ``Module.__getattr__`` lookup of every weight and bias)
    was more than half of a forward of the small control networks (64-unit layers on a few dozen
    rows), and the collector and the evaluation call the actor once per vector step: 47 -> 30 us
    for a CartPole actor on 20 rows. Module hooks registered on the inner layers are therefore not
    run. The cache holds the parameter objects themselves (optimizer steps and
    ``load_state_dict`` update them in place); ``_apply`` (``.to()``, ``.cuda()``, dtype casts),
    which may swap them, drops it.
    """

    _plan: list[tuple[Callable[..., Tensor], tuple[Tensor, ...]]] | None = None

    def forward(self, x: Tensor) -> Tensor:
        plan = self._plan
        if plan is None:
            plan = self._plan = [_layer_op(layer) for layer in self]
        for fn, args in plan:
            x = fn(x, *args)
        return x

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> MLP:
        self._plan = None
        return super()._apply(fn, recurse)


_ELEMENTWISE: dict[type[nn.Module], Callable[[Tensor], Tensor]] = {
    nn.Tanh: torch.tanh,
    nn.ReLU: torch.relu,
    nn.SiLU: nn.functional.silu,
}


def _layer_op(layer: nn.Module) -> tuple[Callable[..., Tensor], tuple[Tensor, ...]]:
    """One layer as ``(function, extra args)``: ``linear(x, W, b)``, ``tanh(x)``, or the
    layer's own ``forward`` (ELU/GELU keep their settings that way)."""
    if type(layer) is nn.Linear:
        return nn.functional.linear, (layer.weight, layer.bias)
    if type(layer) in _ELEMENTWISE:
        return _ELEMENTWISE[type(layer)], ()
    return layer.forward, ()


def mlp(sizes: Sequence[int], activation: str, out_gain: float = 1.0) -> MLP:
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
    return MLP(*layers)


class RunningNorm(nn.Module):
    """Running mean/variance observation normaliser (Welford over batches), saved in state_dict."""

    mean: Tensor
    var: Tensor
    count: Tensor

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


class Actor(nn.Module):
    """One parameter set: MLP from a flat input to logits (categorical) or means (Gaussian)."""

    low: Tensor
    high: Tensor
    log_std: nn.Parameter | None
    net: MLP
    encoder: nn.Module | None

    def __init__(
        self,
        in_dim: int,
        n_actions: int,
        action_low: np.ndarray | None,
        action_high: np.ndarray | None,
        hidden: Sequence[int],
        activation: str,
        log_std_init: float,
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        # image encoder (applied by ActorPolicy.preprocess, before the agent-id one-hot); in_dim
        # is then its feature size plus the one-hot
        self.encoder = encoder
        if n_actions > 0:
            self.kind = "categorical"
            self.out_dim = n_actions
            self.log_std = None
        else:
            assert action_low is not None and action_high is not None
            if not (np.all(np.isfinite(action_low)) and np.all(np.isfinite(action_high))):
                raise UnsupportedSpaceError(
                    f"Box action space [{action_low}, {action_high}] must have finite bounds for the Gaussian policy"
                )
            self.kind = "gaussian"
            self.out_dim = int(np.prod(action_low.shape))
            self.log_std = nn.Parameter(torch.full((self.out_dim,), float(log_std_init)))
            self.register_buffer("low", torch.as_tensor(action_low, dtype=torch.float32).reshape(-1))
            self.register_buffer("high", torch.as_tensor(action_high, dtype=torch.float32).reshape(-1))
        self.net = mlp([in_dim, *hidden, self.out_dim], activation, out_gain=0.01)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def gaussian_logp(self, mean: Tensor, action: Tensor) -> Tensor:
        assert self.log_std is not None
        z = (action - mean) * torch.exp(-self.log_std)
        return -0.5 * z.square().sum(-1) - self._gaussian_norm()

    def _gaussian_norm(self) -> Tensor:
        """``sum(log_std) + k/2 log(2 pi)``: the log-density's action-independent part (a scalar)."""
        assert self.log_std is not None
        return self.log_std.sum() + 0.5 * _LOG_2PI * self.out_dim

    def gaussian_entropy(self, shape: torch.Size) -> Tensor:
        assert self.log_std is not None
        return (0.5 + 0.5 * _LOG_2PI + self.log_std).sum().expand(shape)

    def sample(self, out: Tensor, mask: Tensor | None, deterministic: bool) -> tuple[Tensor, Tensor]:
        """Action and its log-prob from the head's output (logits or means)."""
        if self.kind == "categorical":
            return _sample_categorical(_masked_logits(out, mask), deterministic)
        assert self.log_std is not None
        # The standardised noise is the z of the log-density: no need to recover it from the action.
        norm = self._gaussian_norm()
        if deterministic:
            return out, (-norm).expand(out.shape[:-1])
        eps = torch.randn_like(out)
        return torch.addcmul(out, self.log_std.exp(), eps), eps.square().sum(-1).mul_(-0.5).sub_(norm)

    def score(self, out: Tensor, actions: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Differentiable ``(log_prob, entropy)`` of given actions under the head's output."""
        if self.kind == "categorical":
            logp_all = torch.log_softmax(_masked_logits(out, mask), -1)
            logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            return logp, -(logp_all.exp() * logp_all).sum(-1)
        logp = self.gaussian_logp(out, actions[..., : self.out_dim])
        return logp, self.gaussian_entropy(logp.shape)


def _masked_logits(logits: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return logits
    mask = mask[..., : logits.shape[-1]]
    # an agent with no valid action (finished/padded rows) keeps its raw logits
    usable = mask.any(-1, keepdim=True)
    return torch.where(mask | ~usable, logits, torch.full_like(logits, -1e9))


def _sample_categorical(logits: Tensor, deterministic: bool) -> tuple[Tensor, Tensor]:
    """Gumbel-max sample (or argmax) and its log-prob, without building a distribution object."""
    logp_all = torch.log_softmax(logits, dim=-1)
    if deterministic:
        action = logits.argmax(-1)
    else:
        # -log(E), E ~ Exp(1), is a standard Gumbel sample: three ops instead of -log(-log(U))'s
        # five. The clamp keeps a (vanishingly rare) E = 0 from lifting a masked (-1e9) action.
        noise = torch.empty_like(logits).exponential_().clamp_min_(1e-30)
        action = (logp_all - noise.log()).argmax(-1)
    return action, logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)


class ActorPolicy(nn.Module):
    """Stochastic actors for every agent of an env (see the module docstring).

    ``act`` works on the vector layout (``obs[E, A, D]``); ``log_prob`` on flat step rows
    (``obs[M, D]`` + ``agent[M]``), which is what step-level minibatching hands over.
    ``normalize_obs``: running mean/std of each parameter set's observations, updated after each
    optimizer step (:meth:`update_obs_stats`) so a batch's old and new log-probs use one normaliser.
    """

    agent_key: Tensor
    slot_in_group: Tensor

    def __init__(
        self,
        groups: AgentGroups,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
        normalize_obs: bool = False,
        obs_shape: Sequence[int] | None = None,
        encoder: str = "mlp",
    ) -> None:
        super().__init__()
        self.groups = groups
        # image observations: obs_shape (H, W, C) of the uint8 arrays; encoder "cnn" or "mlp"
        self._image = obs_shape is not None and len(obs_shape) == 3
        self._cnn = self._image and encoder == "cnn"
        if self._image and normalize_obs:
            raise UserInputError(
                "policy.normalize_obs is for vector observations; image observations are scaled to [0, 1]"
            )
        self.agents = list(groups.agents)
        self.n_agents = len(self.agents)
        self.keys = groups.param_keys()
        self.actors: ModuleMap[Actor] = ModuleMap()
        self.norms: ModuleMap[RunningNorm] = ModuleMap()
        self._obs_dim: dict[str, int] = {}
        self._group_size: dict[str, int] = {}
        self._slots: dict[str, list[int]] = {}
        for key in self.keys:
            members = [a for a in self.agents if groups.param_key(a) == key]
            spec = groups.specs[groups.group_of[members[0]]]
            extra = spec.size if groups.agent_id else 0
            enc = None
            if self._cnn:
                from grpo_marl.policies.cnn import NatureCNN

                assert obs_shape is not None
                enc = NatureCNN(obs_shape)
            self.actors[key] = Actor(
                (enc.features_dim if enc is not None else spec.obs_dim) + extra,
                spec.n_actions,
                spec.action_low,
                spec.action_high,
                hidden,
                activation,
                log_std_init,
                encoder=enc,
            )
            if normalize_obs:
                self.norms[key] = RunningNorm((spec.obs_dim,))
            self._obs_dim[key] = spec.obs_dim
            self._group_size[key] = spec.size
            self._slots[key] = [self.agents.index(a) for a in members]
        kinds = {actor.kind for actor in self.actors.values()}
        self.kind = kinds.pop()
        self.action_width = max(a.out_dim for a in self.actors.values()) if self.kind == "gaussian" else 0
        # One parameter set for every agent: the vector layout goes through one forward call.
        self._single = len(self.keys) == 1 and not groups.agent_id
        self.register_buffer(
            "agent_key", torch.tensor([self.keys.index(groups.param_key(a)) for a in self.agents]), persistent=False
        )
        self.register_buffer("slot_in_group", torch.tensor([groups.slot[a] for a in self.agents]), persistent=False)

    # -- inputs ----------------------------------------------------------------------------------
    def action_shape(self) -> tuple[int, ...]:
        """Per-agent action shape in batches: ``()`` (discrete) or ``(k,)`` (Box)."""
        return () if self.kind == "categorical" else (self.action_width,)

    @property
    def action_dtype(self) -> torch.dtype:
        return torch.long if self.kind == "categorical" else torch.float32

    def preprocess(self, key: str, obs: Tensor, agent: Tensor | None = None) -> Tensor:
        """Input of parameter set ``key``: its observation prefix (normalised when asked), plus
        the agent-id one-hot when ``marl.agent_id``."""
        if self._image:
            x = self._image_features(key, obs)
        else:
            x = obs[..., : self._obs_dim[key]].float()
            if key in self.norms:
                x = self.norms[key](x)
        if self.groups.agent_id:
            assert agent is not None
            slot = self.slot_in_group[agent]
            x = torch.cat([x, nn.functional.one_hot(slot, self._group_size[key]).to(x.dtype)], -1)
        return x

    def _image_features(self, key: str, obs: Tensor) -> Tensor:
        """``uint8[..., H, W, C]`` -> features: the parameter set's CNN, or flattened / 255."""
        encoder = self.actors[key].encoder
        if encoder is not None:
            return encoder(obs)
        return obs.reshape(*obs.shape[:-3], -1).float() / 255.0

    @torch.no_grad()
    def update_obs_stats(self, obs: Tensor, agent: Tensor) -> None:
        """Fold flat rows ``obs[M, D]`` of agents ``agent[M]`` into the running statistics."""
        if not len(self.norms):
            return
        key_of_row = self.agent_key[agent]
        for k, key in enumerate(self.keys):
            rows = key_of_row == k
            if bool(rows.any()):
                self.norms[key].update(obs[rows][:, : self._obs_dim[key]])

    # -- acting ----------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: Tensor, action_mask: Tensor | None = None, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """``obs[E, A, D]`` -> actions ``[E, A]`` (discrete) or ``[E, A, k]`` (Box), log-probs ``[E, A]``."""
        if self._single:
            key = self.keys[0]
            return self.actors[key].sample(self.actors[key](self.preprocess(key, obs)), action_mask, deterministic)
        e = obs.shape[0]
        agent = torch.arange(self.n_agents, device=obs.device).repeat(e)
        flat_mask = None if action_mask is None else action_mask.reshape(e * self.n_agents, -1)
        actions, logp = self._act_rows(obs.reshape(e * self.n_agents, *obs.shape[2:]), agent, flat_mask, deterministic)
        return actions.reshape(e, self.n_agents, *actions.shape[1:]), logp.reshape(e, self.n_agents)

    def _act_rows(
        self, obs: Tensor, agent: Tensor, action_mask: Tensor | None, deterministic: bool
    ) -> tuple[Tensor, Tensor]:
        m = obs.shape[0]
        logp = torch.zeros(m, device=obs.device)
        actions = torch.zeros((m, *self.action_shape()), dtype=self.action_dtype, device=obs.device)
        key_of_row = self.agent_key[agent]
        for k, key in enumerate(self.keys):
            rows = (key_of_row == k).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            actor = self.actors[key]
            mask = None if action_mask is None else action_mask[rows]
            act, lp = actor.sample(actor(self.preprocess(key, obs[rows], agent[rows])), mask, deterministic)
            if actor.kind == "categorical":
                actions[rows] = act
            else:
                actions[rows, : act.shape[-1]] = act
            logp[rows] = lp
        return actions, logp

    def log_prob(
        self, obs: Tensor, agent: Tensor, actions: Tensor, action_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Differentiable ``(log_prob, entropy)`` of flat rows (``obs[M, D]``, ``agent[M]``)."""
        if self._single:
            key = self.keys[0]
            return self.actors[key].score(self.actors[key](self.preprocess(key, obs)), actions, action_mask)
        m = obs.shape[0]
        logp = obs.new_zeros(m, dtype=torch.float32)
        ent = obs.new_zeros(m, dtype=torch.float32)
        key_of_row = self.agent_key[agent]
        for k, key in enumerate(self.keys):
            rows = (key_of_row == k).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            actor = self.actors[key]
            mask = None if action_mask is None else action_mask[rows]
            lp, e = actor.score(actor(self.preprocess(key, obs[rows], agent[rows])), actions[rows], mask)
            logp = logp.index_put((rows,), lp)
            ent = ent.index_put((rows,), e)
        return logp, ent

    def host_actor(self) -> HostActor | None:
        """A numpy snapshot of the current actors for the hot loops (greedy evaluation, GRPO's
        episode collection), or ``None`` where it does not apply (see :mod:`grpo_marl.policies.host`)."""
        from grpo_marl.policies.host import HostActor

        return HostActor.from_policy(self)

    def env_actions(self, actions: Tensor) -> Tensor:
        """Actions as the vector env takes them, a tensor on the policy's device (Box actions
        clipped to each agent's bounds; the log-prob stays that of the unclipped sample, as in
        SB3/CleanRL, so the ratio is exact). The collectors hand these to ``VecEnv.step``: an env
        on the same device gets them without a host round trip."""
        if self.kind == "categorical":
            return actions
        if self._single:
            actor = self.actors[self.keys[0]]
            return actions.clamp(actor.low, actor.high)
        out = actions.clone()
        for key in self.keys:
            actor = self.actors[key]
            for a in self._slots[key]:
                out[:, a, : actor.out_dim] = out[:, a, : actor.out_dim].clamp(actor.low, actor.high)
        return out

    def to_env(self, actions: Tensor) -> np.ndarray:
        """:meth:`env_actions` as a numpy array (what ``grpo_marl.load(...).act`` returns)."""
        return self.env_actions(actions).cpu().numpy()


class Critic(nn.Module):
    """Value functions for PPO, one per parameter set of the actor.

    Inputs per row: the agent's own (preprocessed) observation; with ``state_dim > 0`` (MAPPO's
    centralized critic) also the global ``env.state()`` and a one-hot of the agent's index, so one
    shared critic can still value agents differently; with ``time_input`` the elapsed fraction
    of the episode (a fixed-horizon task's value depends on the steps left, which observations
    may not show). Image observations go through the actor's encoder (shared, as SB3's
    ``share_features_extractor``); an image env's state is already downsampled and flat
    (see :mod:`grpo_marl.policies.cnn`).
    """

    agent_key: Tensor

    def __init__(
        self,
        policy: ActorPolicy,
        state_dim: int = 0,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        time_input: bool = False,
    ) -> None:
        super().__init__()
        self.policy_keys = list(policy.keys)
        self.state_dim = int(state_dim)
        self.time_input = bool(time_input)
        self._id_dim = policy.n_agents
        self.nets: ModuleMap[MLP] = ModuleMap()
        for key in self.policy_keys:
            first = policy.actors[key].net[0]
            assert isinstance(first, nn.Linear)
            in_dim = first.in_features
            in_dim += (self.state_dim + self._id_dim if self.state_dim else 0) + int(time_input)
            self.nets[key] = mlp([in_dim, *hidden, 1], activation, out_gain=1.0)
        self.register_buffer("agent_key", policy.agent_key.clone(), persistent=False)

    def forward(
        self,
        policy: ActorPolicy,
        obs: Tensor,
        agent: Tensor,
        state: Tensor | None = None,
        time: Tensor | None = None,
    ) -> Tensor:
        """Values ``[M]`` of flat rows (``obs[M, D]``, ``agent[M]``, ``state[M, S]``, ``time[M]``);
        observations go through ``policy``'s preprocessing (normaliser, agent id)."""
        out = obs.new_zeros(obs.shape[0], dtype=torch.float32)
        key_of_row = self.agent_key[agent]
        for k, key in enumerate(self.policy_keys):
            rows = (key_of_row == k).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            parts = [policy.preprocess(key, obs[rows], agent[rows])]
            if self.state_dim:
                assert state is not None, "a centralized critic needs the global state"
                parts += [state[rows].float(), nn.functional.one_hot(agent[rows], self._id_dim).float()]
            if self.time_input:
                assert time is not None, "this critic takes the episode time"
                parts.append(time[rows].float().unsqueeze(-1))
            x = torch.cat(parts, -1) if len(parts) > 1 else parts[0]
            out = out.index_put((rows,), self.nets[key](x).squeeze(-1))
        return out
