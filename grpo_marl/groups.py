"""Agent -> group maps, per-group spaces, and observation flattening.

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

_INDEX_SUFFIX = re.compile(r"_\d+$")


def default_group_name(agent: str) -> str:
    """``adversary_0`` -> ``adversary``; names without an index suffix are their own group."""
    return _INDEX_SUFFIX.sub("", agent)


def resolve_group_map(
    agents: Sequence[str], override: Mapping[str, Any] | None = None
) -> dict[str, str]:
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
                raise KeyError(f"marl.groups names agent {key!r}, but the env's agents are {list(agents)}")
            targets, group = [key], value
        else:
            patterns = [str(v) for v in value]
            targets = [a for a in agents if any(fnmatch.fnmatchcase(a, p) for p in patterns)]
            if not targets:
                raise KeyError(f"marl.groups[{key!r}]={patterns} matches none of {list(agents)}")
            group = str(key)
        for a in targets:
            if a in claimed and claimed[a] != group:
                raise ValueError(f"agent {a!r} is put in both {claimed[a]!r} and {group!r} by marl.groups")
            claimed[a] = group
            mapping[a] = group
    return mapping


# --------------------------------------------------------------------------------------------
# observation / action space handling
# --------------------------------------------------------------------------------------------


def _obs_part(space: Any) -> Any:
    """The observation sub-space of a ``Dict(observation=..., action_mask=...)`` space."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict) and "observation" in space.spaces:
        return space.spaces["observation"]
    return space


def flat_obs_dim(space: Any) -> int:
    """Length of the float vector :func:`flatten_obs` produces for ``space``."""
    from gymnasium import spaces

    space = _obs_part(space)
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, spaces.Box | spaces.MultiBinary):
        return int(np.prod(space.shape))
    raise TypeError(f"observation space {space} is not supported (Box, Discrete, MultiDiscrete, MultiBinary)")


def flatten_obs(space: Any, obs: Any, out: np.ndarray | None = None) -> np.ndarray:
    """Observation -> float32 vector (Discrete/MultiDiscrete one-hot; Box/MultiBinary flattened)."""
    from gymnasium import spaces

    inner = _obs_part(space)
    if isinstance(obs, dict) and "observation" in obs:
        obs = obs["observation"]
    dim = flat_obs_dim(inner)
    vec = np.zeros(dim, np.float32) if out is None else out
    if isinstance(inner, spaces.Discrete):
        vec[:] = 0.0
        vec[int(obs) - int(inner.start)] = 1.0
    elif isinstance(inner, spaces.MultiDiscrete):
        vec[:] = 0.0
        offsets = np.concatenate([[0], np.cumsum(inner.nvec.ravel())[:-1]])
        vec[offsets + np.asarray(obs).ravel()] = 1.0
    else:
        vec[:] = np.asarray(obs, dtype=np.float32).ravel()
    return vec


def action_mask_of(obs: Any, info: Mapping[str, Any] | None) -> np.ndarray | None:
    """The env-provided action mask (``obs["action_mask"]`` or ``info["action_mask"]``), if any."""
    if isinstance(obs, dict) and "action_mask" in obs:
        return np.asarray(obs["action_mask"], dtype=bool)
    if info and "action_mask" in info:
        return np.asarray(info["action_mask"], dtype=bool)
    return None


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
            raise ValueError(f"marl.share must be 'group' or 'agent', got {share!r}")
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
                raise ValueError(
                    f"agents of group {g!r} have different spaces {detail}; put them in separate groups "
                    f"with marl.groups (e.g. marl.groups={{{members[0]}: {g}_a}})"
                )
            space = action_spaces[members[0]]
            if isinstance(space, spaces.Discrete):
                n_actions, shape, low, high = int(space.n), (), None, None
            elif isinstance(space, spaces.Box):
                n_actions, shape = 0, tuple(int(s) for s in space.shape)
                low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
            else:
                raise TypeError(f"action space {space} of group {g!r} is not supported (Discrete or Box)")
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
