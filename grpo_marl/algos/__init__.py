"""Algorithms, looked up by ``algo.name``: each knows how to turn a rollout batch into named loss
terms; the trainer owns the loop (collect -> prepare -> epochs x minibatches -> step)."""

from __future__ import annotations

from typing import Any, Callable

ALGOS: dict[str, Callable[..., Any]] = {}


def register_algo(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorator(cls: Callable[..., Any]) -> Callable[..., Any]:
        ALGOS[name] = cls
        return cls

    return decorator


def make_algo(name: str, *args: Any, **kwargs: Any) -> Any:
    _load_builtin_algos()
    if name not in ALGOS:
        raise ValueError(f"unknown algo {name!r}; registered: {', '.join(sorted(ALGOS))}")
    return ALGOS[name](*args, **kwargs)


def _load_builtin_algos() -> None:
    import importlib

    for module in ("grpo_marl.algos.grpo", "grpo_marl.algos.ppo"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
