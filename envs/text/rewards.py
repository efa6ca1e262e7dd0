"""Reward functions for text tasks, and a registry to find them by name or ``module:function``.

A reward function scores a batch of completions at once (one Python call per batch, not per
sample) and stands alone, so it can be unit-tested and reused by other trainers (the TRL
benchmark wraps the same functions). Two signatures are accepted:

* the positional form (every built-in reward)::

      def reward(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str],
                 **kwargs) -> list[float]

  ``answers`` holds the dataset's reference answer per prompt (strings; tasks encode structured
  answers as text);
* TRL's form, as ``GRPOTrainer`` calls it::

      def reward(prompts, completions, **kwargs) -> list[float | None]

  called with keywords only: ``prompts=``, ``completions=`` and one keyword list per column of
  the data besides the prompt (``answer=[...]`` for the built-in tasks; every other key of a
  ``text_jsonl`` row, e.g. ``solution=[...]``, its JSON values as they are in the file). For a
  conversational prompt (a list of messages) each completion is passed as TRL passes it,
  ``[{"role": "assistant", "content": text}]``.

:func:`bind_reward` tells them apart from the signature, once, when the task is built; a
function that fits neither is refused there (:class:`~grpo_marl.errors.ConfigError`). Either form
may return ``None`` for a completion it does not apply to (TRL's convention): see
:func:`reward_values`. Users add their own by name with :func:`register_reward` or point to any
importable function as ``"package.module:function"``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from grpo_marl.errors import ConfigError
from grpo_marl.registry import Registry


class RewardFunc(Protocol):
    """A batched reward: one float per completion (the positional form; see the module doc for
    TRL's keyword form, which :func:`bind_reward` accepts as well)."""

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **kwargs: object
    ) -> list[float]: ...


#: Every reward function by name: the built-ins below, :func:`register_reward` from user code, and
#: the ``grpo_marl.rewards`` entry points of installed packages (each a reward function; loaded when
#: a name is not found, and a plugin that fails to import is named only when its reward is asked for).
REWARDS: Registry[RewardFunc] = Registry("reward", entry_point_group="grpo_marl.rewards", error=ConfigError)


def register_reward(name: str, *, overwrite: bool = False) -> Callable[[RewardFunc], RewardFunc]:
    """Decorator: make a reward function available to configs as ``name``."""

    def deco(fn: RewardFunc) -> RewardFunc:
        return REWARDS.register(name, fn, overwrite=overwrite)

    return deco


def get_reward(spec: str | RewardFunc) -> RewardFunc:
    """Resolve a reward function from a registered name, ``module:function``, or a callable.

    Raises :class:`~grpo_marl.errors.ConfigError` (a ``ValueError``) naming the spec."""
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ConfigError(f"reward {spec!r} is not a name or 'package.module:function'")
    if ":" not in spec:
        found = REWARDS.find(spec)
        if found is None:
            raise ConfigError(REWARDS.unknown_message(spec) + " Or give 'package.module:function'.")
        return found
    mod_name, _, attr = spec.partition(":")
    try:
        obj: object = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"reward {spec!r}: cannot import module {mod_name!r} ({e})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"reward {spec!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"reward {spec!r} is not callable")
    return obj  # type: ignore[return-value]


# ----------------------------------------------------------------------------- weights and signatures

#: How a reward function is called: ``f(prompts, completions, answers)``, or TRL's keyword form.
POSITIONAL, TRL = "positional", "trl"
ACCEPTED_FORMS = (
    "the positional form f(prompts, completions, answers) or TRL's form f(prompts, completions, **kwargs), "
    "called with keywords: prompts=, completions= and each column of the data as a list"
)
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_SPLIT_KEY = re.compile(rf"([A-Za-z_][\w.]*)\s*:\s*({_NUMBER})")


def reward_weights(value: object, key: str = "env_kwargs.rewards") -> dict[str, float]:
    """The weighted set of rewards, ``{name: weight}``, from what a config holds: a mapping
    (``{int_match: 1.0, "mypkg.rewards:f": 0.5}``) or a list whose entries are a name (weight 1)
    or a ``[name, weight]`` pair (``[mypkg.rewards:f, [int_match, 0.5]]``, which Hydra's override
    grammar reads without quotes).

    Raises :class:`~grpo_marl.errors.ConfigError` naming ``key``; a weight that reads as the rest of
    a ``module:function`` key (``{mypkg.rewards:f: 1.0}`` on the command line, which Hydra splits at
    the key's first colon into ``{"mypkg.rewards": "f: 1.0"}``) is refused with the forms that work,
    since a second function of the same module would have been dropped without a trace.
    """
    out: dict[str, float] = {}

    def add(name: object, weight: object, shown: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{key}: {shown}: a reward is a registered name or 'package.module:function'")
        if isinstance(weight, str) and _SPLIT_KEY.fullmatch(weight.strip()):
            attr, w = _SPLIT_KEY.fullmatch(weight.strip()).groups()  # type: ignore[union-attr]
            raise ConfigError(
                f"{key}: {{{name}: {weight}}} is how Hydra reads {{{name}:{attr}: {w}}} (a dict key ends at its "
                f"first colon); write the colon as \\: ('+{key}={{{name}\\:{attr}: {w}}}') or list the reward: "
                f"'+{key}=[[{name}:{attr}, {w}]]'"
            )
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            raise ConfigError(f"{key}: {shown}: the weight {weight!r} of {name!r} must be a finite number")
        if name in out:
            raise ConfigError(f"{key}: {name!r} is listed twice")
        out[name] = float(weight)

    if isinstance(value, Mapping):
        for name, weight in value.items():
            add(name, weight, f"{name}: {weight}")
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for entry in value:
            if isinstance(entry, str):
                add(entry, 1.0, repr(entry))
            elif isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) == 2:
                add(entry[0], entry[1], f"[{entry[0]}, {entry[1]}]")
            else:
                raise ConfigError(
                    f"{key}: entry {entry!r} is neither a reward name nor a [name, weight] pair "
                    f"(e.g. '+{key}=[mypkg.rewards:f, [int_match, 0.5]]')"
                )
    else:
        raise ConfigError(
            f"{key}={value!r}: give a dict of name -> weight ('+{key}={{int_match: 1.0, mypkg.rewards\\:f: 0.5}}') "
            f"or a list of names and [name, weight] pairs ('+{key}=[mypkg.rewards:f, [int_match, 0.5]]')"
        )
    if not out:
        raise ConfigError(f"{key}: at least one reward function is required")
    return out


def reward_label(spec: str | RewardFunc, fn: Callable[..., Any]) -> str:
    """``module:function`` of a reward (with its registered name first when it has one)."""
    target = f"{getattr(fn, '__module__', None) or '?'}:{getattr(fn, '__qualname__', None) or type(fn).__qualname__}"
    if isinstance(spec, str) and spec != target:
        return f"{spec} ({target})"
    return target


@dataclass(frozen=True)
class BoundReward:
    """A reward function with the way it is called, decided once from its signature."""

    name: str
    fn: Callable[..., Any]
    form: str
    #: the keywords a TRL-form function accepts (None: any, it takes ``**kwargs``)
    accepts: frozenset[str] | None = None

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[str],
        answers: Sequence[str],
        columns: Mapping[str, Sequence[Any]],
    ) -> Any:
        if self.form == POSITIONAL:
            return self.fn(prompts, completions, answers)
        kwargs: dict[str, Any] = {
            "prompts": list(prompts),
            "completions": [
                [{"role": "assistant", "content": c}] if isinstance(p, list) else c
                for p, c in zip(prompts, completions, strict=True)
            ],
            **{k: list(v) for k, v in columns.items() if k not in ("prompts", "completions")},
        }
        if self.accepts is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
        return self.fn(**kwargs)


def bind_reward(spec: str | RewardFunc, columns: Sequence[str] = ("answer",)) -> BoundReward:
    """Resolve ``spec`` (:func:`get_reward`) and decide from its signature how it is called, given
    the data's ``columns`` (besides the prompt).

    * the positional form ``f(prompts, completions, answers)`` when its third parameter is named
      ``answers`` (the built-in rewards' signature), or it takes ``*args`` without naming
      ``completions``;
    * otherwise TRL's form when the call ``f(prompts=..., completions=..., <column>=...)`` binds:
      every parameter without a default is ``prompts``, ``completions`` or a column, and
      ``completions`` is taken by name or through ``**kwargs`` (a function without ``**kwargs``
      gets only the keywords it names);
    * otherwise, for a function that does not name ``completions``, the positional form when three
      positional arguments bind (``f(p, c, a)``);
    * otherwise :class:`~grpo_marl.errors.ConfigError` naming the function, its signature, what it
      requires that is not offered, and the accepted forms. A function that names ``completions``
      and requires a parameter that is not a column (``f(prompts, completions, solution)`` on data
      without ``solution``) is refused rather than guessed positional.

    A callable without an introspectable signature is called positionally.
    """
    fn = get_reward(spec)
    name = spec if isinstance(spec, str) else reward_label(spec, fn)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return BoundReward(name, fn, POSITIONAL)
    params = list(sig.parameters.values())
    kinds = inspect.Parameter
    var_kw = any(p.kind is kinds.VAR_KEYWORD for p in params)
    var_pos = any(p.kind is kinds.VAR_POSITIONAL for p in params)
    named = {p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
    offered = {"prompts", "completions", *columns}
    required = [p for p in params if p.default is p.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)]
    missing = [p.name for p in required if p.kind is kinds.POSITIONAL_ONLY or p.name not in offered]
    keyword_ok = not missing and ("completions" in named or (var_kw and not var_pos))
    try:
        sig.bind(None, None, None)
        positional_ok = True
    except TypeError:
        positional_ok = False
    leading = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    answers_third = len(leading) >= 3 and leading[2].name == "answers"
    speaks_trl = "completions" in named
    if positional_ok and (answers_third or (var_pos and not speaks_trl)):
        return BoundReward(name, fn, POSITIONAL)
    if keyword_ok:
        return BoundReward(name, fn, TRL, None if var_kw else frozenset(named))
    if positional_ok and not speaks_trl:
        return BoundReward(name, fn, POSITIONAL)
    cols = ", ".join(columns) or "none"
    why = (
        f"it requires {', '.join(repr(m) for m in missing)}, which "
        f"{'is' if len(missing) == 1 else 'are'} not a column of the data (columns: {cols})"
        if missing
        else "it takes neither three positional arguments nor completions= by keyword"
    )
    if "completion_ids" in missing:
        why += "; completion token ids are not passed to reward functions"
    hint = "; a reward called positionally names its third parameter answers" if positional_ok else ""
    shown = sig.replace(
        parameters=[q.replace(annotation=q.empty) for q in params], return_annotation=inspect.Signature.empty
    )
    raise ConfigError(
        f"reward {reward_label(spec, fn)}{shown} cannot be called: {why}. A reward function takes {ACCEPTED_FORMS}{hint}"
    )


def reward_values(vals: object) -> tuple[Any, Any]:
    """A reward function's result as ``(values, applies)``: float64 values with ``None`` (TRL's
    "does not apply to this completion") read as 0.0, and a bool mask that is False where it was
    ``None``. Sizes and finiteness are the caller's to check."""
    import numpy as np

    if isinstance(vals, np.ndarray) and vals.dtype != object:
        arr = np.asarray(vals, dtype=np.float64).reshape(-1)
        return arr, np.ones(arr.shape, dtype=bool)
    items = list(vals)  # type: ignore[call-overload]
    applies = np.array([v is not None for v in items], dtype=bool)
    arr = np.array([0.0 if v is None else v for v in items], dtype=np.float64).reshape(-1)
    if len(arr) != len(applies):  # an entry that is itself a list
        applies = np.ones(arr.shape, dtype=bool)
    return arr, applies


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


_STEP_RE = re.compile(r"(-?\d+)\s*([+\-])\s*(-?\d+)\s*=\s*(-?\d+)")


def chain_steps_credit(text: str) -> float:
    """The fraction of the ``x + y = z`` / ``x - y = z`` steps written in ``text`` that are right
    (0 when it writes none): ``"7 + 5 = 12. 12 - 3 = 8."`` -> 0.5."""
    steps = _STEP_RE.findall(text.replace(",", ""))
    if not steps:
        return 0.0
    right = sum(int(z) == (int(x) + int(y) if op == "+" else int(x) - int(y)) for x, op, y, z in steps)
    return right / len(steps)


@register_reward("chain_steps")
def chain_steps(
    prompts: Sequence[object], completions: Sequence[str], answers: Sequence[str], **kwargs: object
) -> list[float]:
    """Credit inside a worked chain: the fraction of the reply's written ``x +/- y = z`` steps that
    are arithmetically right (:func:`chain_steps_credit`). ``chain_chat`` logs it at weight 0 to
    show where replies go wrong (a right first step, a wrong second) without rewarding it."""
    return [chain_steps_credit(c) for c in completions]


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
