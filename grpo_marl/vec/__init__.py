"""Vector envs: one contract (:mod:`grpo_marl.vec.base`) for every env kind and vectorization."""

from grpo_marl.vec.base import Layout, SnapshotUnsupported, Step, VecEnv
from grpo_marl.vec.factory import make_vec_env, resolve_workers

__all__ = ["Layout", "SnapshotUnsupported", "Step", "VecEnv", "make_vec_env", "resolve_workers"]
