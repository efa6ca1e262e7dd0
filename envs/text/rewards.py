"""Reward functions for text tasks, and a registry to find them by name or ``module:function``.

A reward function scores a batch of completions at once (one Python call per batch, not per
sample) and stands alone, so it can be unit-tested and reused by other trainers (the TRL
benchmark wraps the same functions):

    def reward(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str],
               **kwargs) -> list[float]

``answers`` holds the dataset's reference answer per prompt (strings; tasks encode structured
answers as text). Users add their own by name with :func:`register_reward` or point to any
importable function as ``"package.module:function"``.
"""

from __future__ import annotations

import importlib
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol


class RewardFunc(Protocol):
    """A batched reward: one float per completion."""

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
    ) -> list[float]: ...


REWARDS: dict[str, RewardFunc] = {}


def register_reward(name: str) -> Callable[[RewardFunc], RewardFunc]:
    """Decorator: make a reward function available to configs as ``name``."""

    def deco(fn: RewardFunc) -> RewardFunc:
        if name in REWARDS and REWARDS[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered")
        REWARDS[name] = fn
        return fn

    return deco


def get_reward(spec: str | RewardFunc) -> RewardFunc:
    """Resolve a reward function from a registered name, ``module:function``, or a callable."""
    if callable(spec):
        return spec
    if spec in REWARDS:
        return REWARDS[spec]
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        try:
            obj: object = importlib.import_module(mod_name)
        except ImportError as e:
            raise ValueError(f"reward {spec!r}: cannot import module {mod_name!r} ({e})") from e
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ValueError(f"reward {spec!r}: module {mod_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if not callable(obj):
            raise ValueError(f"reward {spec!r} is not callable")
        return obj  # type: ignore[return-value]
    raise ValueError(f"unknown reward {spec!r}; registered: {sorted(REWARDS)}, or give 'package.module:function'")


# ----------------------------------------------------------------------------- parsing helpers

# Canonical integers only (no leading zeros, no "+"/"-0"): otherwise a policy can spend its
# entropy on free variations ("08", "008") that all score the same, and exploration stalls.
_INT_RE = re.compile(r"^\s*(0|-?[1-9]\d*)\s*$")


def parse_int(text: str) -> int | None:
    """The integer a completion states, if it is exactly one canonical integer (spaces around ok)."""
    m = _INT_RE.match(text)
    return int(m.group(1)) if m else None


def parse_roots(text: str) -> list[int] | None:
    """Roots listed as ``x = r1, r2`` (or ``x = r``); ``None`` when the format does not match."""
    m = _ROOTS_RE.match(text)
    if not m:
        return None
    return [int(v) for v in re.findall(r"-?\d+", m.group(1))]


_ROOTS_RE = re.compile(r"^\s*x\s*=\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*$")


# ----------------------------------------------------------------------------- built-in rewards


@register_reward("exact_match")
def exact_match(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """1 if the stripped completion equals the stripped answer, else 0."""
    return [float(c.strip() == a.strip()) for c, a in zip(completions, answers, strict=True)]


@register_reward("int_match")
def int_match(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """1 if the completion is exactly the integer answer (canonical form, spaces around ok), else 0."""
    out = []
    for c, a in zip(completions, answers, strict=True):
        v = parse_int(c)
        out.append(float(v is not None and v == int(a)))
    return out


@register_reward("int_closeness")
def int_closeness(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """Dense partial credit ``exp(-|pred - answer| / scale)``; 0 when no integer is stated.

    Why: from a random init an exact-match reward is almost always 0, so every group has zero
    variance and GRPO gets no signal; a graded reward orders near misses. ``scale`` defaults to
    ``max(1, |answer| / 4)`` so the shaping is relative to the answer's magnitude.
    """
    out = []
    for c, a in zip(completions, answers, strict=True):
        v = parse_int(c)
        if v is None:
            out.append(0.0)
            continue
        t = int(a)
        scale = max(1.0, abs(t) / 4.0)
        out.append(math.exp(-abs(v - t) / scale))
    return out


@register_reward("int_digits")
def int_digits(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """Per-digit partial credit: the completion's characters compared position-wise (from the
    left, i.e. in generation order) with the answer's, ``matches / len(answer)``. Extra trailing
    characters cost nothing here (``int_match`` is what demands the exact answer and EOS): a
    policy that has the right digits but not yet the stop must still beat a wrong answer that
    stops (``15x`` > ``11`` for 15), or two-digit sums collapse onto whichever one stops first.

    Why: ``int_closeness`` alone has a trap for multi-digit answers. For ``7+6=`` -> ``13`` the
    best *one*-token answer is ``9`` (closest single digit), while the first step towards ``13``,
    emitting ``1``, scores far worse by closeness (``1`` is 12 away) unless the next token is also
    right. A from-scratch policy then collapses onto ``9`` for every two-digit sum (accuracy stalls
    at the 55 one-digit sums). Credit for the right leading digit makes ``1...`` better than ``9``
    at the token where the choice is made.
    """
    out = []
    for c, a in zip(completions, answers, strict=True):
        c, a = c.strip(), a.strip()
        if not c or not a:
            out.append(0.0)
            continue
        hits = sum(x == y for x, y in zip(c, a))
        out.append(hits / len(a))
    return out


_ANY_INT_RE = re.compile(r"-?\d+")


def last_int(text: str) -> int | None:
    """The last integer written anywhere in ``text`` (``"The sum is 42."`` -> 42), or None."""
    found = _ANY_INT_RE.findall(text.replace(",", ""))
    return int(found[-1]) if found else None


@register_reward("last_int_match")
def last_int_match(
    prompts: Sequence[object], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """1 if the last integer in the completion equals the integer answer (free-form replies of
    chat models: ``"The answer is 42."`` counts), else 0."""
    out = []
    for c, a in zip(completions, answers, strict=True):
        v = last_int(c)
        out.append(float(v is not None and v == int(a)))
    return out


@register_reward("int_format")
def int_format(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """1 if the completion is a single integer (any value), else 0."""
    return [float(parse_int(c) is not None) for c in completions]


def _roots_answer(answer: str) -> list[int]:
    roots = parse_roots(answer)
    if roots is None:
        raise ValueError(f"quadratic answer {answer!r} is not of the form 'x = r1, r2'")
    return roots


def _roots_credit(pred: list[int] | None, answer: str) -> float:
    """``matched / max(len(true), len(pred))`` over multisets; a double root may be stated once."""
    if pred is None:
        return 0.0
    true = _roots_answer(answer)
    if len(set(true)) == 1 and len(set(pred)) == 1 and len(pred) == 1:
        pred = pred * len(true)  # "x = 3" for a double root 3
    matched = sum((Counter(pred) & Counter(true)).values())
    return matched / max(len(true), len(pred))


@register_reward("quadratic_roots")
def quadratic_roots(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """Partial credit per root: fraction of the true roots (as a multiset) the completion states.

    Order does not matter; stating extra values costs the same as missing ones (the score is
    ``matched / max(len(true), len(stated))``). A double root may be written once (``x = 3``).
    """
    return [_roots_credit(parse_roots(c), a) for c, a in zip(completions, answers, strict=True)]


# "x = 3, -2", "x = 3 and x = -2", "x = 3 or -2": one statement of roots in a free-form reply.
# An integer followed by more digits, "." + digit or "/" is not taken (x = 2.5, x = 3/2).
_INT_ROOT = r"-?\d+(?![\d/]|\.\d)"
_STATED_RE = re.compile(
    rf"(?<![A-Za-z0-9^])x\s*=\s*({_INT_ROOT}(?:\s*(?:,\s*and|,\s*or|,|and|or)\s*(?:x\s*=\s*)?{_INT_ROOT})*)"
)


def stated_roots(text: str) -> list[int] | None:
    """The roots a free-form reply states last (``"The roots are x = 3 and x = -2."`` -> [3, -2]),
    or None when it states none as ``x = <integer>``."""
    found = _STATED_RE.findall(text)
    return [int(v) for v in re.findall(r"-?\d+", found[-1])] if found else None


@register_reward("quadratic_roots_stated")
def quadratic_roots_stated(
    prompts: Sequence[object], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """:func:`quadratic_roots` for chat models' free-form replies: the credit of the last
    ``x = r1, r2`` / ``x = r1 and x = r2`` statement anywhere in the reply (:func:`stated_roots`)."""
    return [_roots_credit(stated_roots(c), a) for c, a in zip(completions, answers, strict=True)]


@register_reward("quadratic_exact_stated")
def quadratic_exact_stated(
    prompts: Sequence[object], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """1 if the roots a free-form reply states last equal the true roots (any order), else 0."""
    return [float(r == 1.0) for r in quadratic_roots_stated(prompts, completions, answers)]


@register_reward("quadratic_exact")
def quadratic_exact(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """1 if the stated roots equal the true roots as a multiset (any order), else 0."""
    return [float(r == 1.0) for r in quadratic_roots(prompts, completions, answers)]


@register_reward("quadratic_format")
def quadratic_format(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """1 if the completion has the form ``x = r1, r2`` (the seed guide's format reward)."""
    return [float(parse_roots(c) is not None) for c in completions]


@register_reward("nonempty")
def nonempty(
    prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """1 for a non-blank completion (a minimal format reward for free-form JSONL tasks)."""
    return [float(bool(c.strip())) for c in completions]
