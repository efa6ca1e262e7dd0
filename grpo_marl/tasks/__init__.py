"""Task glue per env kind: the trainer builds one with :func:`make_task` and sees nothing else."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch
from omegaconf import DictConfig

from grpo_marl.errors import MissingExtraError
from grpo_marl.registry import EnvSpec, get_spec

# env kind -> "module:Class" of its Task (imported lazily: text pulls in transformers).
TASKS = {
    "gymnasium": "grpo_marl.tasks.control:ControlTask",
    "pettingzoo": "grpo_marl.tasks.control:ControlTask",
    "text": "grpo_marl.tasks.text:TextTask",
}


#: env kind -> (module, pip extra) it needs beyond the base install.
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "text": (("transformers", "text"), ("tokenizers", "text")),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module stubbed out
        return False


def check_extras(cfg: DictConfig, spec: EnvSpec | None = None) -> None:
    """Raise :class:`MissingExtraError` naming the ``pip install`` command when the env kind (or an
    option such as ``model.lora.enabled``) needs an optional dependency that is not installed."""
    spec = spec or get_spec(str(cfg.env))
    needs = list(EXTRAS.get(spec.kind, ()))
    if spec.kind == "text" and bool(cfg.get("model", {}).get("lora", {}).get("enabled", False)):
        needs.append(("peft", "lora"))
    if spec.kind == "pettingzoo":  # butterfly/sisl families and SuperSuit preprocessing: marl-extra
        from grpo_marl.marl import preprocess

        section = cfg.get("env_preprocess") or {}
        absent = preprocess.missing_modules(spec.name, section)
        if absent:
            raise MissingExtraError(preprocess.missing_extra_message(spec.name, absent))
    missing = [(module, extra) for module, extra in needs if not _installed(module)]
    if missing:
        modules = ", ".join(module for module, _ in missing)
        extra = missing[0][1]
        what = f"{spec.kind} env" if spec.kind != "text" or extra == "text" else "model.lora.enabled=true"
        raise MissingExtraError(
            f"env {spec.name!r} ({what}) needs {modules}, which is not installed; install the {extra!r} extra: "
            f"pip install 'grpo_marl[{extra}]' (from a clone: pip install -e '.[{extra}]')"
        )


def make_task(cfg: DictConfig, spec: EnvSpec, device: torch.device, collector: str, with_state: bool = False) -> Any:
    module, _, cls = TASKS[spec.kind].partition(":")
    try:
        task_cls = getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as exc:
        extra = next((e for m, e in EXTRAS.get(spec.kind, ()) if m == exc.name), None)
        if extra is None:
            raise
        raise MissingExtraError(
            f"env {spec.name!r} ({spec.kind} env) needs {exc.name}, which is not installed; "
            f"pip install 'grpo_marl[{extra}]' (from a clone: pip install -e '.[{extra}]')"
        ) from exc
    # with_state: the algorithm's critic reads the env's global state (MAPPO)
    return task_cls(cfg, spec, device, collector=collector, **({"with_state": True} if with_state else {}))
