"""A user's reward functions, written as for TRL's ``GRPOTrainer`` (tests/test_text_rewards_trl.py).

TRL calls a reward ``f(prompts=..., completions=..., **columns)``: the dataset's other columns
arrive as keyword lists, and ``None`` marks a completion the reward does not apply to. grpo_marl
takes them as they are: ``+env_kwargs.rewards={grpo_marl_outside.rewards\\:solution_match: 1.0}``.
"""

from __future__ import annotations

from typing import Any

#: every call of :func:`record`: the keywords it received (for tests)
RECORDED: list[dict[str, Any]] = []


def _text(completion: Any) -> str:
    """A completion as text: a string, or TRL's conversational ``[{"role": "assistant", ...}]``."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion)


def solution_match(prompts: list[Any], completions: list[Any], solution: list[Any], **kwargs: Any) -> list[float]:
    """1.0 where the completion is the row's ``solution`` (stripped), else 0.0."""
    if len(solution) != len(completions) or len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions, {len(solution)} solutions")
    return [float(_text(c).strip() == str(s)) for c, s in zip(completions, solution, strict=True)]


def short_enough(completions: list[Any], max_chars: list[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 where the completion has at most the row's ``max_chars`` characters; ``None`` (does not
    apply) for rows without ``max_chars``."""
    limits = max_chars if max_chars is not None else [None] * len(completions)
    return [None if m is None else float(len(_text(c)) <= int(m)) for c, m in zip(completions, limits, strict=True)]


def record(**kwargs: Any) -> list[float]:
    """Scores 0.0 and keeps what it was called with in :data:`RECORDED`."""
    RECORDED.append(kwargs)
    return [0.0] * len(kwargs["completions"])


def needs_reference(prompts: list[Any], completions: list[Any], reference: list[Any]) -> list[float]:
    """TRL form requiring a ``reference`` column (refused on data without one)."""
    return [float(_text(c) == r) for c, r in zip(completions, reference, strict=True)]
