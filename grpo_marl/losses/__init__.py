"""Policy losses and token aggregation.

Losses are ``nn.Module`` classes looked up by name in :data:`LOSSES`, so a config says
``algo.loss=gspo`` and the trainer calls :func:`make_loss`; new variants register themselves with
:func:`register_loss` (from user code too) instead of growing an ``if loss_type == ...`` chain.
The registry is defined before the built-in loss modules are imported so that those modules (and
future ones such as ``ppo.py``) can ``from grpo_marl.losses import register_loss`` without an
import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from grpo_marl.registry import Registry

LossT = TypeVar("LossT", bound=type[nn.Module])

#: name -> loss class (an ``nn.Module`` subclass); ``algo.loss`` accepts every GRPO-family name in it.
LOSSES: Registry[type[nn.Module]] = Registry("loss", entry_point_group="grpo_marl.losses")


def register_loss(name: str) -> Callable[[LossT], LossT]:
    """Class decorator registering a loss module under ``name`` (from user code too)."""

    def decorator(cls: LossT) -> LossT:
        LOSSES.register(name, cls)
        return cls

    return decorator


def make_loss(name: str, **kwargs: Any) -> nn.Module:
    """Instantiate the loss registered as ``name`` with ``kwargs``."""
    return LOSSES.get(name)(**kwargs)


from grpo_marl.losses.aggregation import (  # noqa: E402  (registry must exist first)
    AGGREGATIONS,
    AggregationFn,
    register_aggregation,
    token_weights,
)
from grpo_marl.losses.grpo import GRPOLoss, GSPOLoss  # noqa: E402
from grpo_marl.losses.ppo import PPOLoss  # noqa: E402

register_loss("grpo")(GRPOLoss)
register_loss("gspo")(GSPOLoss)
register_loss("ppo")(PPOLoss)

__all__ = [
    "AGGREGATIONS",
    "AggregationFn",
    "GRPOLoss",
    "GSPOLoss",
    "LOSSES",
    "PPOLoss",
    "make_loss",
    "register_aggregation",
    "register_loss",
    "token_weights",
]
