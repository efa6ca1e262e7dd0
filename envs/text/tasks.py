"""Prompt datasets and text tasks: arithmetic, quadratic equations, and any local JSONL file.

A :class:`TextTask` is data + scoring, with no model in it: a train and an eval
:class:`PromptSet` (held-out prompts), weighted reward functions, the reward that defines
``accuracy``, the alphabet a locally built tokenizer needs, and a completion-length hint. The
Gymnasium env (``envs.text.env``) serves one prompt per episode; the GRPO Task scores whole
batches through :meth:`TextTask.score` so rewards cost one call per function per update.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from envs.text.rewards import RewardFunc, get_reward


@dataclass(frozen=True)
class PromptSet:
    """Parallel lists of prompts and reference answers."""

    prompts: tuple[str, ...]
    answers: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.answers):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.answers)} answers")

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass
class TextTask:
    """A prompt dataset with its scoring.

    ``rewards`` maps a reward name (a registry name or ``module:function``) to its weight; the
    total reward is the weighted sum. ``accuracy`` names the 0/1 reward reported as
    ``eval/accuracy``.
    """

    name: str
    train: PromptSet
    eval: PromptSet
    rewards: dict[str, float]
    accuracy: str
    alphabet: str
    max_new_tokens: int
    _fns: dict[str, RewardFunc] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.rewards:
            raise ValueError(f"task {self.name!r}: at least one reward function is required")
        if len(self.train) == 0 or len(self.eval) == 0:
            raise ValueError(f"task {self.name!r}: train and eval splits must be non-empty")
        names = set(self.rewards) | {self.accuracy}
        self._fns = {n: get_reward(n) for n in names}

    def split(self, name: str) -> PromptSet:
        """``train`` or ``eval``."""
        if name == "train":
            return self.train
        if name == "eval":
            return self.eval
        raise ValueError(f"unknown split {name!r}; use 'train' or 'eval'")

    def score(
        self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str]
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """Score a batch: ``(total[B], per_function{name: [B]}, accuracy[B])`` as float64 arrays."""
        per: dict[str, np.ndarray] = {}
        for n in self._fns:
            vals = self._fns[n](prompts, completions, answers)
            if len(vals) != len(completions):
                raise ValueError(f"reward {n!r} returned {len(vals)} values for {len(completions)} completions")
            per[n] = np.asarray(vals, dtype=np.float64)
        total = np.zeros(len(completions), dtype=np.float64)
        for n, w in self.rewards.items():
            total += w * per[n]
        acc = per[self.accuracy]
        return total, {n: per[n] for n in self.rewards}, acc


def _split(
    prompts: list[str], answers: list[str], eval_frac: float, seed: int
) -> tuple[PromptSet, PromptSet]:
    """Shuffle deterministically and hold out ``eval_frac``; ``eval_frac=0`` evaluates on all."""
    if not 0.0 <= eval_frac < 1.0:
        raise ValueError(f"eval_frac must be in [0, 1), got {eval_frac}")
    idx = list(range(len(prompts)))
    if eval_frac == 0.0:
        full = PromptSet(tuple(prompts), tuple(answers))
        return full, full
    random.Random(seed).shuffle(idx)
    n_eval = max(1, round(eval_frac * len(idx)))
    ev, tr = idx[:n_eval], idx[n_eval:]
    return (
        PromptSet(tuple(prompts[i] for i in tr), tuple(answers[i] for i in tr)),
        PromptSet(tuple(prompts[i] for i in ev), tuple(answers[i] for i in ev)),
    )




def arithmetic_task(
    digits: int = 1,
    ops: str = "+",
    max_problems: int = 10_000,
    eval_frac: float | None = None,
    split_seed: int = 0,
    rewards: dict[str, float] | None = None,
    operands: Sequence[int] | None = None,
) -> TextTask:
    """``a+b=`` -> ``c`` over all operand pairs with ``digits`` digits (0..10**digits-1).

    Single digit (100 problems) evaluates on all 100 prompts by default (``eval_frac=0``): the
    target is learning the table, not generalising from part of it. With more digits, 20% of
    problems (at most ``max_problems`` in all, sampled deterministically) are held out.
    ``operands`` restricts a and b to a list (e.g. ``[1, 2]`` for a tiny 4-prompt task).
    """
    for op in ops:
        if op not in "+-*":
            raise ValueError(f"arithmetic: unsupported op {op!r}; choose from '+-*'")
    vals = list(operands) if operands is not None else list(range(10**digits))
    problems = [(a, op, b) for op in ops for a in vals for b in vals]
    if len(problems) > max_problems:
        problems = random.Random(split_seed).sample(problems, max_problems)
    prompts, answers = [], []
    for a, op, b in problems:
        res = a + b if op == "+" else a - b if op == "-" else a * b
        prompts.append(f"{a}{op}{b}=")
        answers.append(str(res))
    if eval_frac is None:
        eval_frac = 0.0 if (digits == 1 or operands is not None) else 0.2
    train, ev = _split(prompts, answers, eval_frac, split_seed)
    max_ans = max(len(a) for a in answers)
    return TextTask(
        name="arithmetic",
        train=train,
        eval=ev,
        # int_digits: credit for the right leading digit, so two-digit sums are not trapped at the
        # closest one-digit answer ("9"); see envs/text/rewards.py:int_digits.
        rewards=rewards if rewards is not None else {"int_match": 1.0, "int_digits": 1.0, "int_closeness": 0.5},
        accuracy="int_match",
        # Only the characters the task uses: every extra token is one more way to be wrong
        # that a from-scratch policy must first learn to avoid.
        alphabet="0123456789=" + "".join(dict.fromkeys(ops + ("-" if "-" in ops else ""))),
        max_new_tokens=max_ans + 1,
    )


QUAD_ALPHABET = "0123456789x^+-=, Solve"


def format_quadratic(r1: int, r2: int) -> tuple[str, str]:
    """Prompt and answer for the monic quadratic with roots r1, r2 (answer roots descending)."""
    b, c = -(r1 + r2), r1 * r2
    terms = "x^2"
    if b:
        coef = "" if abs(b) == 1 else str(abs(b))
        terms += f" {'+' if b > 0 else '-'} {coef}x"
    if c:
        terms += f" {'+' if c > 0 else '-'} {abs(c)}"
    hi, lo = max(r1, r2), min(r1, r2)
    return f"Solve {terms} = 0", f"x = {hi}, {lo}"


def quadratic_task(
    low: int = -9,
    high: int = 9,
    eval_frac: float = 0.2,
    split_seed: int = 0,
    rewards: dict[str, float] | None = None,
) -> TextTask:
    """``Solve x^2 + 4x + 3 = 0`` -> ``x = -1, -3``: every monic quadratic with integer roots in
    ``[low, high]``; partial credit per root plus a format reward (the seed guide's example)."""
    prompts, answers = [], []
    for r1 in range(low, high + 1):
        for r2 in range(low, r1 + 1):
            p, a = format_quadratic(r1, r2)
            prompts.append(p)
            answers.append(a)
    train, ev = _split(prompts, answers, eval_frac, split_seed)
    max_ans = max(len(a) for a in answers)
    return TextTask(
        name="quadratic",
        train=train,
        eval=ev,
        rewards=rewards if rewards is not None else {"quadratic_roots": 1.0, "quadratic_format": 0.2},
        accuracy="quadratic_exact",
        alphabet=QUAD_ALPHABET,
        max_new_tokens=max_ans + 1,
    )


def _read_jsonl(path: Path, prompt_key: str, answer_key: str) -> tuple[list[str], list[str]]:
    prompts, answers = [], []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if prompt_key not in row or answer_key not in row:
                raise ValueError(
                    f"{path}:{lineno}: expected keys {prompt_key!r} and {answer_key!r}, got {sorted(row)}"
                )
            prompts.append(str(row[prompt_key]))
            answers.append(str(row[answer_key]))
    if not prompts:
        raise ValueError(f"{path}: no rows")
    return prompts, answers


def jsonl_task(
    path: str,
    eval_path: str | None = None,
    eval_frac: float = 0.1,
    split_seed: int = 0,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    rewards: dict[str, float] | None = None,
    accuracy: str = "exact_match",
    alphabet: str | None = None,
    max_new_tokens: int | None = None,
) -> TextTask:
    """Prompt/answer pairs from a local JSONL file, scored by reward functions chosen by name or
    ``module:function``. ``eval_path`` gives an explicit held-out file; otherwise ``eval_frac`` of
    the rows are held out."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"text_jsonl: {p} does not exist (env_kwargs.path)")
    prompts, answers = _read_jsonl(p, prompt_key, answer_key)
    if eval_path:
        train = PromptSet(tuple(prompts), tuple(answers))
        ep, ea = _read_jsonl(Path(eval_path).expanduser(), prompt_key, answer_key)
        ev = PromptSet(tuple(ep), tuple(ea))
    else:
        train, ev = _split(prompts, answers, eval_frac, split_seed)
    if alphabet is None:
        chars = sorted(set("".join(prompts + answers + list(ev.prompts) + list(ev.answers))))
        alphabet = "".join(chars)
    if max_new_tokens is None:
        max_new_tokens = max(len(a) for a in answers) + 1
    return TextTask(
        name=f"jsonl:{p.name}",
        train=train,
        eval=ev,
        rewards=rewards if rewards is not None else {accuracy: 1.0},
        accuracy=accuracy,
        alphabet=alphabet,
        max_new_tokens=max_new_tokens,
    )


TASKS = {"arithmetic": arithmetic_task, "quadratic": quadratic_task, "text_jsonl": jsonl_task}
