"""Multi-agent (PettingZoo Parallel API) support: env construction, agent groups, vectorization,
snapshots, reference policies and agent-group advantages.

Everything here is independent of torch except :mod:`grpo_marl.marl.policy` and
:mod:`grpo_marl.marl.advantages`, so env worker processes stay light.
"""

from grpo_marl.marl.envs import MARL_ENVS, MarlEnvInfo, make_parallel_env, marl_env_names
from grpo_marl.marl.groups import AgentGroups, GroupSpec

__all__ = [
    "MARL_ENVS",
    "AgentGroups",
    "GroupSpec",
    "MarlEnvInfo",
    "make_parallel_env",
    "marl_env_names",
]
