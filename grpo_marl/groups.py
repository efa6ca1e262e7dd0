"""Agent-groups and group modes: which rollouts share parameters and which are compared.

An *agent-group* is a set of agents that are interchangeable for learning: same observation and
action spaces, one shared parameter set (unless ``share="agent"``), and — for GRPO's ``agent``
grouping — rewards that are comparable. By default the group of ``adversary_0`` is ``adversary``
(the name with its trailing ``_<index>`` removed); a config override can regroup freely.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo_marl.errors import ConfigError, UnsupportedSpaceError
from grpo_marl.registry import Registry
from grpo_marl.vec.spaces import action_mask_of, flat_obs_dim

_INDEX_SUFFIX = re.compile(r"_\d+$")


def default_group_name(agent: str) -> str:
    """``adversary_0`` -> ``adversary``; names without an index suffix are their own group."""
    return _INDEX_SUFFIX.sub("", agent)


def resolve_group_map(agents: Sequence[str], override: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Map every agent to a group name.

    ``override`` may map agent -> group (``{"agent_0": "red"}``) or group -> list of agent names
    or glob patterns (``{"red": ["agent_0", "agent_1"], "blue": ["agent_*"]}``). Agents that no
    override names fall back to :func:`default_group_name`. An agent claimed by two groups is an
    error, because its rollouts would be counted twice.
    """
    mapping = {a: default_group_name(a) for a in agents}
    if not override:
        return mapping
    claimed: dict[str, str] = {}
    for key, value in override.items():
        if isinstance(value, str):
            if key not in mapping:
                raise ConfigError(f"marl.groups names agent {key!r}, but the env's agents are {list(agents)}")
            targets, group = [key], value
        else:
            patterns = [str(v) for v in value]
            targets = [a for a in agents if any(fnmatch.fnmatchcase(a, p) for p in patterns)]
            if not targets:
                raise ConfigError(f"marl.groups[{key!r}]={patterns} matches none of {list(agents)}")
            group = str(key)
        for a in targets:
            if a in claimed and claimed[a] != group:
                raise ConfigError(f"agent {a!r} is put in both {claimed[a]!r} and {group!r} by marl.groups")
            claimed[a] = group
            mapping[a] = group
    return mapping


@dataclass(frozen=True)
class GroupSpec:
    """One agent-group: its agents (in ``possible_agents`` order) and their common spaces.

    n_actions: number of discrete actions (0 for continuous); action_shape: Box action shape
    (``()`` for discrete); obs_dim: flattened observation length (before the optional agent-id
    one-hot); has_action_mask: whether the env hands out masks for this group.
    """

    name: str
    agents: tuple[str, ...]
    obs_dim: int
    n_actions: int
    action_shape: tuple[int, ...]
    action_low: np.ndarray | None
    action_high: np.ndarray | None
    has_action_mask: bool

    @property
    def size(self) -> int:
        return len(self.agents)

    @property
    def discrete(self) -> bool:
        return self.n_actions > 0


class AgentGroups:
    """The agent -> group map of one env plus everything the learner needs per group.

    share: ``"group"`` (one parameter set per agent-group, the default) or ``"agent"`` (one per
    agent; the agent-group then only decides which rollouts GRPO compares and how metrics are
    aggregated). agent_id: append a one-hot of the agent's index within its group to its
    observation, so that shared parameters can still specialise.
    """

    def __init__(
        self,
        possible_agents: Sequence[str],
        observation_spaces: Mapping[str, Any],
        action_spaces: Mapping[str, Any],
        override: Mapping[str, Any] | None = None,
        share: str = "group",
        agent_id: bool = False,
        has_action_mask: Mapping[str, bool] | None = None,
    ) -> None:
        from gymnasium import spaces

        if share not in ("group", "agent"):
            raise ConfigError(f"marl.share must be 'group' or 'agent', got {share!r}")
        self.agents: tuple[str, ...] = tuple(possible_agents)
        self.share = share
        self.agent_id = bool(agent_id)
        self.group_of: dict[str, str] = resolve_group_map(self.agents, override)
        order: list[str] = []
        for a in self.agents:
            if self.group_of[a] not in order:
                order.append(self.group_of[a])
        masks = dict(has_action_mask or {})
        self.specs: dict[str, GroupSpec] = {}
        for g in order:
            members = tuple(a for a in self.agents if self.group_of[a] == g)
            dims = {flat_obs_dim(observation_spaces[a]) for a in members}
            acts = {repr(action_spaces[a]) for a in members}
            if len(dims) != 1 or len(acts) != 1:
                detail = {a: (flat_obs_dim(observation_spaces[a]), str(action_spaces[a])) for a in members}
                raise UnsupportedSpaceError(
                    f"agents of group {g!r} have different spaces {detail}; put them in separate groups "
                    f"with marl.groups (e.g. marl.groups={{{members[0]}: {g}_a}})"
                )
            space = action_spaces[members[0]]
            shape: tuple[int, ...]
            if isinstance(space, spaces.Discrete):
                n_actions, shape, low, high = int(space.n), (), None, None
            elif isinstance(space, spaces.Box):
                n_actions, shape = 0, tuple(int(s) for s in space.shape)
                low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
            else:
                raise UnsupportedSpaceError(f"action space {space} of group {g!r} is not supported (Discrete or Box)")
            self.specs[g] = GroupSpec(
                name=g,
                agents=members,
                obs_dim=dims.pop(),
                n_actions=n_actions,
                action_shape=shape,
                action_low=low,
                action_high=high,
                has_action_mask=any(masks.get(a, False) for a in members),
            )
        self.names: tuple[str, ...] = tuple(self.specs)
        self.group_index: dict[str, int] = {g: i for i, g in enumerate(self.names)}
        # slot of each agent within its group (for agent-id inputs and [E, A_g] layouts)
        self.slot: dict[str, int] = {a: self.specs[self.group_of[a]].agents.index(a) for a in self.agents}

    @classmethod
    def from_env(
        cls,
        env: Any,
        override: Mapping[str, Any] | None = None,
        share: str = "group",
        agent_id: bool = False,
    ) -> AgentGroups:
        """Build from a Parallel env (reads spaces; probes one reset for action masks)."""
        agents = list(env.possible_agents)
        obs, infos = env.reset(seed=0)
        masks = {a: action_mask_of(obs.get(a), infos.get(a)) is not None for a in agents}
        return cls(
            agents,
            {a: env.observation_space(a) for a in agents},
            {a: env.action_space(a) for a in agents},
            override=override,
            share=share,
            agent_id=agent_id,
            has_action_mask=masks,
        )

    @classmethod
    def from_layout(
        cls,
        layout: Any,
        override: Mapping[str, Any] | None = None,
        share: str = "group",
        agent_id: bool = False,
    ) -> AgentGroups:
        """Build from a vector env's :class:`~grpo_marl.vec.base.Layout` (a Gymnasium env is one
        agent in one group)."""
        return cls(
            layout.agents,
            dict(zip(layout.agents, layout.observation_spaces, strict=True)),
            dict(zip(layout.agents, layout.action_spaces, strict=True)),
            override=override,
            share=share,
            agent_id=agent_id,
            has_action_mask={a: layout.has_action_mask for a in layout.agents},
        )

    def input_dim(self, group: str) -> int:
        """Policy input length for ``group`` (obs plus the optional agent-id one-hot)."""
        spec = self.specs[group]
        return spec.obs_dim + (spec.size if self.agent_id else 0)

    def param_keys(self) -> list[str]:
        """Names of the parameter sets: one per group, or one per agent with ``share="agent"``."""
        if self.share == "group":
            return list(self.names)
        return list(self.agents)

    def param_key(self, agent: str) -> str:
        return self.group_of[agent] if self.share == "group" else agent

    def describe(self) -> dict[str, list[str]]:
        return {g: list(s.agents) for g, s in self.specs.items()}


# --------------------------------------------------------------------------------------------
# group modes
# --------------------------------------------------------------------------------------------

# Group modes (how rollouts of one collection are compared):
# GRPO groups for multi-agent rollouts: which agent-trajectories are compared with which.
#
# A multi-agent collection runs ``E = S * G`` envs (``S`` seed-groups of ``G`` envs reset from the
# same joint initial state; seed-group members are contiguous envs) with ``A`` agents each. Every
# (env, agent) pair is one *rollout*, numbered ``r = e * A + a``. A grouping picks sets of rollouts
# whose returns are comparable:
#
# * ``seed``: the same agent across the ``G`` copies of one initial state -> ``S * A`` groups of
#   ``G``. Works for every reward structure, including a team reward shared by all agents.
# * ``agent``: the members of one agent-group inside one episode -> ``E * n_groups`` groups of
#   ``|group|``. Needs *individual* rewards: with a team reward every member of the group has the
#   same return, every group has zero variance, and the advantage is 0 everywhere (no signal).
#   Members also start from different positions, so the comparison is noisier than ``seed``.
# * ``seed_agent`` (the product): an agent-group's members across the ``G`` copies ->
#   ``S * n_groups`` groups of ``G * |group|``. A larger baseline; with a team reward it carries the
#   same signal as ``seed`` (between copies), diluted by duplicate members.
#
# Agent-groups of different sizes give groups of different sizes; shorter groups are padded with
# ``-1`` (an invalid member that holds no steps) so that every group has the same width and the
# Batch stays a plain ``[groups * width, T]`` reshape.

GROUPINGS: tuple[str, ...] = ("seed", "agent", "seed_agent")


@dataclass(frozen=True)
class GroupMode:
    """One ``algo.group_mode``: which rollouts of a collection GRPO compares, and what it needs.

    The requirements are capabilities, not env names, so a family decides by what it offers
    (:meth:`grpo_marl.families.EnvFamily.group_mode_error`) and a mode registered from user code
    (:func:`register_group_mode`, or a ``grpo_marl.group_modes`` entry point) is checked like a
    built-in. A mode with other groups than the three layouts overrides :meth:`arrange`.
    """

    name: str
    #: one line for messages and docs
    description: str = ""
    #: the layout of the rollout rows (:func:`arrange_groups`): ``seed``, ``agent`` or ``seed_agent``
    grouping: str = "seed"
    #: it compares the agents of one env, so it needs a multi-agent env
    multi_agent: bool = False
    #: members start from a restored env snapshot (state branching): the env must support snapshots,
    #: and the collection is the state-group collector's (:mod:`grpo_marl.collectors.states`)
    snapshots: bool = False

    def arrange(self, num_seed_groups: int, group_size: int, groups: AgentGroups) -> np.ndarray:
        """Rollout ids ``[num_grpo_groups, width]`` of one collection (``-1`` = padding)."""
        return arrange_groups(self.grouping, num_seed_groups, group_size, groups)


#: Every ``algo.group_mode``, by name.
GROUP_MODES: Registry[GroupMode] = Registry("group mode", entry_point_group="grpo_marl.group_modes", error=ConfigError)


def register_group_mode(mode: GroupMode, *, overwrite: bool = False) -> GroupMode:
    """Make ``mode`` available as ``algo.group_mode=<mode.name>``."""
    if mode.grouping not in GROUPINGS:
        raise ValueError(f"group mode {mode.name!r}: grouping must be one of {', '.join(GROUPINGS)}")
    return GROUP_MODES.register(mode.name, mode, overwrite=overwrite)


def group_mode(name: str) -> GroupMode:
    """The registered mode ``name``; an unknown one raises :class:`~grpo_marl.errors.ConfigError`
    naming the registered modes (and the closest one)."""
    return GROUP_MODES.get(name)


for _mode in (
    GroupMode("seed", "G rollouts from one initial state (the same reset seed)"),
    GroupMode("state", "G branches from a snapshot of a visited state", snapshots=True),
    GroupMode("agent", "the agents of one agent-group inside one episode", grouping="agent", multi_agent=True),
    GroupMode(
        "seed_agent", "an agent-group's members across the G seed copies", grouping="seed_agent", multi_agent=True
    ),
):
    register_group_mode(_mode)


def arrange_groups(
    grouping: str,
    num_seed_groups: int,
    group_size: int,
    groups: AgentGroups,
) -> np.ndarray:
    """Rollout ids ``[num_grpo_groups, width]`` (``-1`` = padding) for one collection.

    Args:
        grouping: one of :data:`GROUPINGS`.
        num_seed_groups: ``S``, seed-groups per collection.
        group_size: ``G``, envs per seed-group (1 is fine for ``agent``).
        groups: the env's agent-groups (agent order = rollout order within an env).
    """
    if grouping not in GROUPINGS:
        raise ConfigError(f"unknown marl grouping {grouping!r}; choose one of {', '.join(GROUPINGS)}")
    n_agents = len(groups.agents)
    pos = {a: i for i, a in enumerate(groups.agents)}
    slots = {g: [pos[a] for a in spec.agents] for g, spec in groups.specs.items()}
    rows: list[list[int]] = []
    if grouping == "seed":
        for s in range(num_seed_groups):
            for a in range(n_agents):
                rows.append([(s * group_size + m) * n_agents + a for m in range(group_size)])
    elif grouping == "agent":
        for e in range(num_seed_groups * group_size):
            for g in groups.names:
                rows.append([e * n_agents + a for a in slots[g]])
    else:
        for s in range(num_seed_groups):
            for g in groups.names:
                rows.append([(s * group_size + m) * n_agents + a for m in range(group_size) for a in slots[g]])
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def team_reward_fraction(rewards: Tensor, mask: Tensor, tol: float = 1e-8) -> float:
    """Fraction of (env, step) pairs whose alive agents all got the same reward.

    ``rewards``/``mask`` are ``[E, A, T]``. 1.0 means a pure team reward, where the ``agent``
    grouping carries no signal (see the module docstring).
    """
    inf = torch.tensor(float("inf"), dtype=rewards.dtype)
    hi = torch.where(mask, rewards, -inf).amax(1)
    lo = torch.where(mask, rewards, inf).amin(1)
    any_alive = mask.any(1)
    if not bool(any_alive.any()):
        return 0.0
    equal = (hi - lo) <= tol
    return float(equal[any_alive].float().mean())
