"""Task glue per env family: the trainer builds one with :func:`make_task` and sees nothing else.

Which Task class a family uses, and which optional packages it needs, is the family's
(:mod:`grpo_marl.families`); these two functions are the trainer's and the CLI's entry to it.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from grpo_marl.families import get_family
from grpo_marl.registry import EnvSpec, get_spec
from grpo_marl.tasks.base import Task


def check_extras(cfg: DictConfig, spec: EnvSpec | None = None) -> None:
    """Raise :class:`~grpo_marl.errors.MissingExtraError` naming the ``pip install`` command when
    the env's family (or an option such as ``model.lora.enabled``) needs an optional dependency
    that is not installed."""
    spec = spec or get_spec(str(cfg.env))
    get_family(spec.kind).check_extras(cfg, spec)


def make_task(cfg: DictConfig, spec: EnvSpec, device: torch.device, collector: str, with_state: bool = False) -> Task:
    """The Task of ``spec``'s family (``with_state``: the algorithm's critic reads the env's global state)."""
    return get_family(spec.kind).make_task(cfg, spec, device, collector, with_state)
