"""Task glue per env kind: the trainer builds one with :func:`make_task` and sees nothing else."""

from __future__ import annotations

import importlib
from typing import Any

import torch
from omegaconf import DictConfig

from grpo_marl.registry import EnvSpec

# env kind -> "module:Class" of its Task (imported lazily: text pulls in transformers).
TASKS = {
    "gymnasium": "grpo_marl.tasks.gym:GymTask",
    "pettingzoo": "grpo_marl.tasks.marl:MARLTask",
    "text": "grpo_marl.tasks.text:TextTask",
}


def make_task(cfg: DictConfig, spec: EnvSpec, device: torch.device, collector: str) -> Any:
    module, _, cls = TASKS[spec.kind].partition(":")
    try:
        task_cls = getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as exc:
        raise RuntimeError(
            f"env {spec.name!r} is of kind {spec.kind!r}, whose support module {module} could not be "
            f"imported ({exc}); install the matching extra (e.g. pip install 'grpo_marl[text]')"
        ) from exc
    return task_cls(cfg, spec, device, collector=collector)
