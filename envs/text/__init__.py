"""Text-generation environments (kind ``text``): ``arithmetic``, ``quadratic``, ``text_jsonl``.

Importing this package only registers names; gymnasium/numpy/the tasks are imported inside the
factories, and transformers only by the LLM policy, so ``grpo_marl.registry`` stays cheap.
Factories take the task's keyword arguments (``env_kwargs`` on the CLI) plus ``split``.
"""

from __future__ import annotations

from typing import Any

from grpo_marl.registry import register_env

__all__ = ["make_text_env"]


def make_text_env(task: str, split: str = "train", **task_kwargs: Any) -> Any:
    """Build a :class:`envs.text.env.TextEnv` for a built-in task name and its kwargs."""
    from envs.text.env import TextEnv
    from envs.text.tasks import TASKS

    if task not in TASKS:
        raise ValueError(f"unknown text task {task!r}; choose from {sorted(TASKS)}")
    return TextEnv(TASKS[task](**task_kwargs), split=split)


def _arithmetic(split: str = "train", **kw: Any) -> Any:
    return make_text_env("arithmetic", split=split, **kw)


def _quadratic(split: str = "train", **kw: Any) -> Any:
    return make_text_env("quadratic", split=split, **kw)


def _jsonl(split: str = "train", **kw: Any) -> Any:
    return make_text_env("text_jsonl", split=split, **kw)


# Tuned defaults (applied under the user's CLI overrides). Tiny models trained from scratch
# want a larger learning rate than fine-tuning and no KL anchor to their random init.
_FROM_SCRATCH: dict[str, Any] = {
    "algo": {"beta": 0.0, "epochs": 1, "minibatches": 1, "ref_refresh": 0},
}

register_env(
    "arithmetic",
    _arithmetic,
    kind="text",
    defaults=_FROM_SCRATCH,
    threshold=0.95,
    description="a+b= -> c (digits=1: all 100 single-digit sums); reward int_match + 0.5 int_closeness",
)
register_env(
    "quadratic",
    _quadratic,
    kind="text",
    defaults=_FROM_SCRATCH,
    threshold=0.8,
    description="Solve x^2 + 4x + 3 = 0 -> x = -1, -3; partial credit per root + format reward",
)
register_env(
    "text_jsonl",
    _jsonl,
    kind="text",
    defaults={},
    threshold=None,
    description="prompt/answer pairs from env_kwargs.path (JSONL); rewards by name or module:function",
)
