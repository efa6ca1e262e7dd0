"""Algorithms, looked up by ``algo.name``: each turns a rollout batch into named loss terms; the
trainer owns the loop (collect -> prepare -> epochs x minibatches -> step).

An algorithm subclasses :class:`Algorithm` and declares its collector, whether its critic reads
the env's global state, and which config keys torchrun divides across ranks. ``mappo`` and
``ippo`` are PPO under names whose config files set the critic options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Generic

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from grpo_marl.batch import Batch, minibatch_indices
from grpo_marl.errors import ConfigError
from grpo_marl.registry import Registry
from grpo_marl.settings import AlgoSettings
from grpo_marl.tasks.base import P, R, Task


class Algorithm(Generic[P, R]):
    """Base of every algorithm (no-op hooks where an algorithm has nothing to do); generic in
    its Task's policy and reference classes (see :class:`grpo_marl.tasks.base.Task`)."""

    #: collector the Task builds for it (``episodes`` or ``steps``, see grpo_marl.collectors)
    collector: ClassVar[str] = "episodes"
    #: config keys that hold *global* batch sizes, divided by the torchrun world size
    split_keys: ClassVar[tuple[str, ...]] = ()
    #: the dataclass of its ``algo`` section (keys, defaults, help, ranges and cross-key rules;
    #: :mod:`grpo_marl.settings`); ``None``: its section is not checked key by key
    settings: ClassVar[type[AlgoSettings] | None] = None

    def __init__(self, cfg: DictConfig, task: Task[P, R], device: torch.device) -> None:
        self.cfg = cfg
        self.task = task
        self.device = device
        self.updates = 0
        self.minibatches = 1

    @classmethod
    def needs_state(cls, cfg: DictConfig) -> bool:
        """Whether the Task must record the env's global state (a centralized critic)."""
        return False

    @classmethod
    def derive_sizes(cls, cfg: DictConfig) -> None:
        """Fill the sizes that follow from the algorithm's own keys in the run config of a
        vectorized family: ``vec.num_envs`` when the user left it 0, and whatever else its
        section derives. Called once, when the config is resolved; nothing by default."""

    def modules(self) -> dict[str, nn.Module]:
        """Trained modules besides the policy (a critic); optimized and checkpointed with it."""
        return {}

    def reference(self) -> nn.Module | None:
        """A frozen module every torchrun rank must hold identically (GRPO's KL reference)."""
        return None

    def collect(self) -> Batch:
        return self.task.collect(self.task.policy)

    def prepare(self, batch: Batch) -> tuple[dict[str, Tensor] | None, dict[str, float]]:
        raise NotImplementedError

    def set_minibatches(self, k: int) -> None:
        """How many minibatches the trainer splits this update's data into."""
        self.minibatches = int(k)

    def loss(self, mb: dict[str, Tensor]) -> dict[str, Tensor]:
        raise NotImplementedError

    def minibatch_indices(self, data: dict[str, Tensor], k: int) -> list[Tensor]:
        """Row indices of this epoch's ``k`` minibatches (random rows, each row once)."""
        n = next(iter(data.values())).shape[0]
        return list(minibatch_indices(n, k))

    def micro_batches(self, mb: dict[str, Tensor]) -> list[tuple[dict[str, Tensor], float]]:
        """Pieces of a minibatch whose losses add up to the minibatch's loss, each with its share
        of the minibatch's loss weight (to merge mean statistics). The trainer back-propagates
        each piece and steps once (gradient accumulation). Default: the minibatch whole."""
        return [(mb, 1.0)]

    def after_update(self) -> None:
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])


#: ``algo.name`` -> algorithm class (built-ins imported on first lookup, then ``grpo_marl.algos``
#: entry points); which env families an algorithm trains is the families' (``EnvFamily.algos``).
ALGOS: Registry[type[Algorithm]] = Registry(
    "algorithm",
    modules=("grpo_marl.algos.grpo", "grpo_marl.algos.ppo"),
    entry_point_group="grpo_marl.algos",
    error=ConfigError,
)


def register_algo(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    def decorator(cls: type[Algorithm]) -> type[Algorithm]:
        ALGOS.register(name, cls)
        return cls

    return decorator


def get_algo(name: str) -> type[Algorithm]:
    return ALGOS.get(name)


def make_algo(name: str, *args: Any, **kwargs: Any) -> Algorithm:
    return get_algo(name)(*args, **kwargs)


def _load_builtin_algos() -> None:
    ALGOS.load_modules()
