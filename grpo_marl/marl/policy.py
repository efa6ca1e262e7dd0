"""Multi-agent actor (and critics for IPPO/MAPPO): one MLP per parameter set.

Parameters are shared within an agent-group (``marl.share=group``) or held per agent
(``marl.share=agent``). Every call works on the vector layout: observations ``[..., A, D]``
zero-padded to the largest agent observation, or on flat step rows with an ``agent`` index
(``[M, D]`` + ``agent[M]``), which is what step-level minibatching hands over. Each parameter
set reads only its own observation prefix (plus the optional agent-id one-hot), so padded
heterogeneous agents (speaker/listener) never see each other's padding.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from grpo_marl.marl.groups import AgentGroups
from grpo_marl.policies.mlp import MLPPolicy, mlp


class MultiAgentPolicy(nn.Module):
    """Stochastic per-agent actors over the padded vector layout.

    Discrete actions use masked categoricals: invalid actions (``action_mask`` False) get
    probability 0, both when sampling and in ``log_prob``, so the surrogate ratio stays exact.
    """

    def __init__(
        self,
        groups: AgentGroups,
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.groups = groups
        self.agents = list(groups.agents)
        self.keys = groups.param_keys()
        self.actors = nn.ModuleDict()
        # per parameter set: agent slots it drives, the group spec, and the agent-id width
        self._slots: dict[str, list[int]] = {}
        for key in self.keys:
            members = [a for a in self.agents if groups.param_key(a) == key]
            spec = groups.specs[groups.group_of[members[0]]]
            obs_space = spaces.Box(-np.inf, np.inf, (spec.obs_dim,), np.float32)
            if spec.discrete:
                act_space: spaces.Space = spaces.Discrete(spec.n_actions)
            else:
                act_space = spaces.Box(spec.action_low, spec.action_high, spec.action_shape, np.float32)
            extra = spec.size if groups.agent_id else 0
            self.actors[key] = MLPPolicy(
                obs_space, act_space, hidden=hidden, activation=activation, log_std_init=log_std_init, extra_inputs=extra
            )
            self._slots[key] = [self.agents.index(a) for a in members]
        self.discrete = all(groups.specs[g].discrete for g in groups.names)
        self.n_agents = len(self.agents)
        # agent slot -> index of its parameter set, obs length, slot within its group, group size
        self.register_buffer(
            "agent_key", torch.tensor([self.keys.index(groups.param_key(a)) for a in self.agents]), persistent=False
        )
        self._obs_dim = [groups.specs[groups.group_of[a]].obs_dim for a in self.agents]
        self.register_buffer("slot_in_group", torch.tensor([groups.slot[a] for a in self.agents]), persistent=False)
        self._group_size = [groups.specs[groups.group_of[a]].size for a in self.agents]

    # -- inputs ----------------------------------------------------------------------------
    def _inputs(self, key: str, obs: Tensor, agent: Tensor) -> Tensor:
        """Policy input of parameter set ``key`` for rows ``obs[M, D]`` of agents ``agent[M]``."""
        a0 = self._slots[key][0]
        x = obs[:, : self._obs_dim[a0]]
        if self.groups.agent_id:
            size = self._group_size[a0]
            slot = self.slot_in_group[agent]
            x = torch.cat([x, nn.functional.one_hot(slot, size).to(x.dtype)], -1)
        return x

    @staticmethod
    def _masked_logits(logits: Tensor, mask: Tensor | None) -> Tensor:
        if mask is None:
            return logits
        mask = mask[..., : logits.shape[-1]]
        # an agent with no valid action (finished/padded rows) keeps its raw logits
        usable = mask.any(-1, keepdim=True)
        return torch.where(mask | ~usable, logits, torch.full_like(logits, -1e9))

    # -- acting ----------------------------------------------------------------------------
    @torch.no_grad()
    def act(
        self, obs: Tensor, action_mask: Tensor | None = None, deterministic: bool = False
    ) -> tuple[Tensor, Tensor]:
        """``obs[E, A, D]`` -> actions ``[E, A]`` (discrete) or ``[E, A, k]`` (Box), log-probs ``[E, A]``."""
        e = obs.shape[0]
        flat_obs = obs.reshape(e * self.n_agents, -1)
        agent = torch.arange(self.n_agents, device=obs.device).repeat(e)
        flat_mask = None if action_mask is None else action_mask.reshape(e * self.n_agents, -1)
        actions, logp = self.act_flat(flat_obs, agent, flat_mask, deterministic)
        return actions.reshape(e, self.n_agents, *actions.shape[1:]), logp.reshape(e, self.n_agents)

    @torch.no_grad()
    def act_flat(
        self, obs: Tensor, agent: Tensor, action_mask: Tensor | None = None, deterministic: bool = False
    ) -> tuple[Tensor, Tensor]:
        m = obs.shape[0]
        logp = torch.zeros(m, device=obs.device)
        if self.discrete:
            actions = torch.zeros(m, dtype=torch.long, device=obs.device)
        else:
            width = max(int(np.prod(self.groups.specs[g].action_shape)) for g in self.groups.names)
            actions = torch.zeros(m, width, device=obs.device)
        key_of_row = self.agent_key[agent]
        for k, key in enumerate(self.keys):
            rows = (key_of_row == k).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            actor = self.actors[key]
            x = self._inputs(key, obs[rows], agent[rows])
            if actor.kind == "categorical":
                mask = None if action_mask is None else action_mask[rows]
                logits = self._masked_logits(actor(x), mask)
                logp_all = torch.log_softmax(logits, -1)
                if deterministic:
                    act = logits.argmax(-1)
                else:
                    gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp_(1e-20, 1.0)))
                    act = (logp_all + gumbel).argmax(-1)
                actions[rows] = act
                logp[rows] = logp_all.gather(-1, act.unsqueeze(-1)).squeeze(-1)
            else:
                act, lp = actor.act(x, deterministic=deterministic)
                actions[rows, : act.shape[-1]] = act
                logp[rows] = lp
        return actions, logp

    def log_prob(
        self, obs: Tensor, agent: Tensor, actions: Tensor, action_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Differentiable ``(log_prob, entropy)`` of flat rows (``obs[M, D]``, ``agent[M]``)."""
        m = obs.shape[0]
        logp = obs.new_zeros(m)
        ent = obs.new_zeros(m)
        key_of_row = self.agent_key[agent]
        for k, key in enumerate(self.keys):
            rows = (key_of_row == k).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            actor = self.actors[key]
            x = self._inputs(key, obs[rows], agent[rows])
            if actor.kind == "categorical":
                mask = None if action_mask is None else action_mask[rows]
                logits = self._masked_logits(actor(x), mask)
                logp_all = torch.log_softmax(logits, -1)
                lp = logp_all.gather(-1, actions[rows].long().unsqueeze(-1)).squeeze(-1)
                e = -(logp_all.exp() * logp_all).sum(-1)
            else:
                lp, e = actor.log_prob(x, actions[rows, : actor.act_dim])
            logp = logp.index_put((rows,), lp)
            ent = ent.index_put((rows,), e)
        return logp, ent

    def to_env(self, actions: Tensor) -> np.ndarray:
        """Actions as the vector env takes them (Box actions clipped to each agent's bounds)."""
        out = actions.cpu().numpy()
        if self.discrete:
            return out
        for key in self.keys:
            actor = self.actors[key]
            lo, hi = actor.low.cpu().numpy(), actor.high.cpu().numpy()
            for a in self._slots[key]:
                out[:, a, : actor.act_dim] = np.clip(out[:, a, : actor.act_dim], lo, hi)
        return out


class MultiAgentCritic(nn.Module):
    """Value functions for the PPO baselines, one per parameter set.

    ``centralized=False`` (IPPO): ``V(o_i)`` from the agent's own observation.
    ``centralized=True`` (MAPPO): ``V(s, i)`` from the global ``env.state()`` plus the agent's
    own observation and id, so one shared critic can still value agents differently.
    """

    def __init__(
        self,
        groups: AgentGroups,
        state_dim: int = 0,
        centralized: bool = False,
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        time_input: bool = False,
    ) -> None:
        super().__init__()
        if centralized and state_dim <= 0:
            raise ValueError("a centralized (MAPPO) critic needs env.state(); this env has no state_space")
        self.groups = groups
        self.agents = list(groups.agents)
        self.keys = groups.param_keys()
        self.centralized = centralized
        self.time_input = bool(time_input)
        self.nets = nn.ModuleDict()
        self._obs_dim: dict[str, int] = {}
        self._id_dim = len(self.agents)
        for key in self.keys:
            member = next(a for a in self.agents if groups.param_key(a) == key)
            obs_dim = groups.specs[groups.group_of[member]].obs_dim
            self._obs_dim[key] = obs_dim
            in_dim = obs_dim + (state_dim + self._id_dim if centralized else 0) + int(time_input)
            self.nets[key] = mlp([in_dim, *hidden, 1], activation, out_gain=1.0)
        self.register_buffer(
            "agent_key", torch.tensor([self.keys.index(groups.param_key(a)) for a in self.agents]), persistent=False
        )

    def forward(self, obs: Tensor, agent: Tensor, state: Tensor | None = None, time: Tensor | None = None) -> Tensor:
        """Values ``[M]`` of flat rows (``obs[M, D]``, ``agent[M]``, ``state[M, S]`` for MAPPO,
        ``time[M]`` = elapsed fraction of the episode when ``time_input``)."""
        out = obs.new_zeros(obs.shape[0])
        key_of_row = self.agent_key[agent]
        for k, key in enumerate(self.keys):
            rows = (key_of_row == k).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            x = obs[rows, : self._obs_dim[key]]
            if self.centralized:
                if state is None:
                    raise ValueError("the MAPPO critic needs the global state")
                one_hot = nn.functional.one_hot(agent[rows], self._id_dim).to(x.dtype)
                x = torch.cat([x, state[rows], one_hot], -1)
            if self.time_input:
                if time is None:
                    raise ValueError("this critic takes the episode time (time_input=True)")
                x = torch.cat([x, time[rows].to(x.dtype).unsqueeze(-1)], -1)
            out = out.index_put((rows,), self.nets[key](x).squeeze(-1))
        return out

