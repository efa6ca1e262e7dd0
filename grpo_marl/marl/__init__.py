"""What is truly multi-agent: PettingZoo env construction under short names (with the direct
mpe2 Parallel driver), the ``marl`` config section, and scripted reference policies.

Everything else — vector envs, collectors, policies, PPO — is shared with single-agent envs,
which are the one-agent case (see docs/ARCHITECTURE.md).
"""

from grpo_marl.marl.envs import MARL_ENVS, MarlEnvInfo, make_parallel_env, marl_env_names

__all__ = ["MARL_ENVS", "MarlEnvInfo", "make_parallel_env", "marl_env_names"]
