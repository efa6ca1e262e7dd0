"""Prompt datasets and text tasks: arithmetic, quadratic equations, and any local JSONL file.

A :class:`TextTask` is data + scoring, with no model in it: a train and an eval
:class:`PromptSet` (held-out prompts), weighted reward functions, the reward that defines
``accuracy``, the alphabet a locally built tokenizer needs, and a completion-length hint. The
Gymnasium env (``envs.text.env``) serves one prompt per episode; the GRPO Task scores whole
batches through :meth:`TextTask.score` so rewards cost one call per function per update.

A prompt is a string or, in TRL's conversational format, a list of ``{"role", "content"}``
messages that the trainer renders through the model's chat template (``text.chat_template``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envs.text.rewards import TRL, BoundReward, bind_reward, reward_values, reward_weights
from grpo_marl.errors import ConfigError, DatasetError, RewardFunctionError

#: A prompt: plain text, or chat messages ``[{"role": ..., "content": ...}, ...]``.
Prompt = Any
#: The weighted set of rewards a task takes: ``{name: weight}``, or a list of names (weight 1) and
#: ``[name, weight]`` pairs (see :func:`envs.text.rewards.reward_weights`).
RewardWeights = Mapping[str, float] | Sequence[Any]

#: Tokens beyond the longest answer (and its EOS) in the default completion budget of a task
#: whose budget follows the tokenizer (``text_jsonl``) when the model is pretrained: room for the
#: lead-in a chat model writes before its answer (see :func:`answer_token_budget`).
PREAMBLE_TOKENS = 16


def answer_token_budget(answers: Sequence[str], tokenizer: Any, *, pretrained: bool, room: int | None = None) -> int:
    """Completion budget in tokens for reference ``answers`` under the run's ``tokenizer``:
    the longest answer's token count, plus 1 for the EOS token, plus :data:`PREAMBLE_TOKENS`
    (16) when the model is ``pretrained`` (``model.path``), capped at ``room`` (the model's
    context length minus the longest prompt) but never below the answer + EOS.

    Why these terms. The budget must fit the answer *in tokens of this tokenizer*: a character
    count (the old hint) is the right number only for the char tokenizer of a model built from
    scratch, and a BPE tokenizer's tokens are not characters. A model built from scratch learns
    to answer bare, so the answer and its stop token are all it needs (every extra token is one
    more way to be wrong, and the hint stays what it was). A pretrained chat model does not
    answer bare: asked ``Compute 25 + 49. Reply with the number only.``, SmolLM2-135M-Instruct
    writes ``25 + 49 = 74`` (10 tokens + EOS for a 2-token answer) or ``The answer is 58.``; cut at
    the answer's 3 tokens it scores 0. 16 tokens cover such a restatement or a short
    ``The answer is``-style lead-in, and the headroom is nearly free for completions that stop
    sooner: sampling ends once every row has stopped and scoring cuts unused columns, so only
    rows that ramble pay for it. Longer preambles (reasoning) need ``text.max_new_tokens``.
    """
    unique = sorted(set(answers))
    ids = tokenizer(unique, add_special_tokens=False)["input_ids"] if unique else []
    longest = max((len(x) for x in ids), default=1)
    need = longest + 1
    budget = need + (PREAMBLE_TOKENS if pretrained else 0)
    if room is not None:
        budget = max(need, min(budget, room))
    return budget


class RowAnswer(str):
    """A reference answer that carries its data row's other columns (every key of a JSONL row
    besides the prompt, JSON values as they are in the file), for rewards in TRL's keyword form.

    It is the answer string everywhere else, so it travels wherever answers go (a batch's answers
    are this task's own objects) and :meth:`TextTask.score` reads the columns back from them."""

    columns: Mapping[str, Any]

    def __new__(cls, text: str, columns: Mapping[str, Any]) -> RowAnswer:
        obj = super().__new__(cls, text)
        obj.columns = dict(columns)
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (RowAnswer, (str(self), self.columns))


def prompt_text(prompt: Prompt) -> str:
    """A plain-text form of a prompt (chat messages joined as ``role: content`` lines)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m['role']}: {m['content']}" for m in prompt)


@dataclass(frozen=True)
class PromptSet:
    """Parallel lists of prompts (strings or chat messages) and reference answers."""

    prompts: tuple[Prompt, ...]
    answers: tuple[str, ...]
    #: where each prompt came from (``file:line`` of a JSONL row), for errors that name the row;
    #: empty for generated tasks
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.answers):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.answers)} answers")

    def source(self, i: int) -> str:
        """Where prompt ``i`` came from: ``file:line``, or ``prompt #i`` of a generated task."""
        return self.sources[i] if self.sources else f"prompt #{i}"

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass
class TextTask:
    """A prompt dataset with its scoring.

    ``rewards`` maps a reward name (a registry name or ``module:function``) to its weight (or lists
    names and ``[name, weight]`` pairs, :func:`~envs.text.rewards.reward_weights`); the total
    reward is the weighted sum, a ``None`` from a function adding nothing (TRL's ``nansum``).
    ``accuracy`` names the 0/1 reward reported as ``eval/accuracy``. Each function's signature is
    checked here, against the data's :attr:`columns` (:func:`~envs.text.rewards.bind_reward`).
    ``answer_column`` is the column the answers are (``answer``; a JSONL task's ``answer_key``). ``max_new_tokens`` is the completion-length hint; with
    ``budget_from_tokenizer`` it is only the character-count fallback, and the trainer asks
    :meth:`completion_budget` once the model's tokenizer is known.
    """

    name: str
    train: PromptSet
    eval: PromptSet
    rewards: dict[str, float]  # a mapping or a list of names / [name, weight] pairs is normalized to this
    accuracy: str
    alphabet: str
    max_new_tokens: int
    budget_from_tokenizer: bool = False
    answer_column: str = "answer"
    _fns: dict[str, BoundReward] = field(default_factory=dict, repr=False)
    _column_names: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.rewards:
            raise ValueError(f"task {self.name!r}: at least one reward function is required")
        self.rewards = reward_weights(self.rewards)
        if len(self.train) == 0 or len(self.eval) == 0:
            raise ValueError(f"task {self.name!r}: train and eval splits must be non-empty")
        names: dict[str, None] = {}
        for a in self.train.answers + self.eval.answers:
            names.update(dict.fromkeys(getattr(a, "columns", None) or (self.answer_column,)))
        self._column_names = tuple(sorted(names, key=lambda k: (k != self.answer_column, k)))
        self._fns = {n: bind_reward(n, self._column_names) for n in dict.fromkeys([*self.rewards, str(self.accuracy)])}

    @property
    def columns(self) -> tuple[str, ...]:
        """The data's columns besides the prompt, which TRL-form rewards get as keyword lists: a
        JSONL file's other keys (the answer's first, then by name), else ``(answer_column,)``."""
        return self._column_names

    def _columns(self, answers: Sequence[str], names: Sequence[str]) -> dict[str, list[Any]]:
        """Each column as a list over a batch (None where a row lacks the key)."""
        rows = [getattr(a, "columns", None) or {self.answer_column: str(a)} for a in answers]
        return {k: [r.get(k) for r in rows] for k in names}

    def completion_budget(self, tokenizer: Any, *, pretrained: bool, room: int | None = None) -> int:
        """The completion budget (tokens) for this tokenizer: ``max_new_tokens``, or with
        ``budget_from_tokenizer`` :func:`answer_token_budget` over both splits' answers."""
        if not self.budget_from_tokenizer:
            return self.max_new_tokens
        return answer_token_budget(self.train.answers + self.eval.answers, tokenizer, pretrained=pretrained, room=room)

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
        """Score a batch: ``(total[B], per_function{name: [B]}, accuracy[B])`` as float64 arrays.

        A ``None`` from a function (it does not apply to that completion) is 0 in its values: it
        adds nothing to the total, as TRL's ``nansum`` over functions, counts as 0 in the
        function's logged mean and, from the accuracy function, as not correct."""
        keyword = any(f.form == TRL for f in self._fns.values())
        columns = self._columns(answers, self.columns) if keyword else {}
        per: dict[str, np.ndarray] = {}
        for n in self._fns:
            per[n] = self._call_reward(n, prompts, completions, answers, columns)
        total = np.zeros(len(completions), dtype=np.float64)
        for n, w in self.rewards.items():
            total += w * per[n]
        acc = per[self.accuracy]
        return total, {n: per[n] for n in self.rewards}, acc

    def _call_reward(
        self,
        name: str,
        prompts: Sequence[Prompt],
        completions: Sequence[str],
        answers: Sequence[str],
        columns: Mapping[str, Sequence[Any]],
    ) -> np.ndarray:
        """One reward function's values (``None`` read as 0); a raise, a wrong length or a
        non-finite value stops the run with the function's name and the completion it failed on."""
        fn = self._fns[name]
        try:
            arr, applies = reward_values(fn(prompts, completions, answers, columns))
        except Exception as exc:  # any error of user code is reported by name
            bad = _first_failing(fn, prompts, completions, answers, columns)
            where = f" on completion {completions[bad]!r} (answer {answers[bad]!r})" if bad is not None else ""
            raise RewardFunctionError(
                f"reward function {name!r} of task {self.name!r} raised {type(exc).__name__}: {exc}{where}"
            ) from exc
        if len(arr) != len(completions):
            raise RewardFunctionError(
                f"reward function {name!r} of task {self.name!r} returned {len(arr)} values for "
                f"{len(completions)} completions (it must return one float per completion)"
            )
        finite = np.isfinite(arr) | ~applies
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            raise RewardFunctionError(
                f"reward function {name!r} of task {self.name!r} returned {arr[i]} for completion "
                f"{completions[i]!r} (answer {answers[i]!r}); rewards must be finite numbers (or None where "
                "the function does not apply)"
            )
        return arr


def _first_failing(
    fn: BoundReward,
    prompts: Sequence[Prompt],
    completions: Sequence[str],
    answers: Sequence[str],
    columns: Mapping[str, Sequence[Any]],
) -> int | None:
    """Index of the first completion the reward raises on alone (None if none does)."""
    for i in range(len(completions)):
        try:
            reward_values(fn([prompts[i]], [completions[i]], [answers[i]], {k: [v[i]] for k, v in columns.items()}))
        except Exception:  # noqa: BLE001 - probing which completion the user's reward fails on
            return i
    return None


def _split(
    prompts: Sequence[Prompt], answers: list[str], eval_frac: float, seed: int, sources: Sequence[str] = ()
) -> tuple[PromptSet, PromptSet]:
    """Shuffle deterministically and hold out ``eval_frac``; ``eval_frac=0`` evaluates on all."""
    if not 0.0 <= eval_frac < 1.0:
        raise ValueError(f"eval_frac must be in [0, 1), got {eval_frac}")
    idx = list(range(len(prompts)))
    if eval_frac == 0.0:
        full = PromptSet(tuple(prompts), tuple(answers), tuple(sources))
        return full, full
    random.Random(seed).shuffle(idx)
    n_eval = max(1, round(eval_frac * len(idx)))
    ev, tr = idx[:n_eval], idx[n_eval:]

    def pick(rows: list[int]) -> PromptSet:
        where = tuple(sources[i] for i in rows) if sources else ()
        return PromptSet(tuple(prompts[i] for i in rows), tuple(answers[i] for i in rows), where)

    return pick(tr), pick(ev)


def arithmetic_task(
    digits: int = 1,
    ops: str = "+",
    max_problems: int = 10_000,
    eval_frac: float | None = None,
    split_seed: int = 0,
    rewards: RewardWeights | None = None,
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


ARITH_CHAT_INSTRUCTION = "Compute {a} + {b}. Reply with the number only."


def arith_chat_task(
    low: int = 1,
    high: int = 50,
    n_train: int = 2000,
    n_eval: int = 100,
    split_seed: int = 0,
    instruction: str = ARITH_CHAT_INSTRUCTION,
    format_weight: float = 0.0,
    rewards: RewardWeights | None = None,
    max_new_tokens: int = 12,
) -> TextTask:
    """Two-number addition as a chat turn, for pretrained instruct models: the user message
    ``Compute 17 + 25. Reply with the number only.``, answer ``42``.

    All pairs ``a, b`` in ``[low, high]`` are shuffled with ``split_seed``; the first ``n_eval``
    are held out and the next ``n_train`` train. Reward: 1 when the last integer of the reply is
    ``a + b`` (``last_int_match``, also the accuracy), plus ``format_weight`` x ``int_format``
    (the reply is a bare integer) when > 0.
    """
    pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    if n_eval < 1 or n_train < 1 or n_eval + n_train > len(pairs):
        raise ConfigError(
            f"arith_chat: n_train={n_train} + n_eval={n_eval} must be >= 1 each and at most the "
            f"{len(pairs)} pairs in [{low}, {high}] (env_kwargs.n_train / env_kwargs.n_eval)"
        )
    random.Random(split_seed).shuffle(pairs)

    def rows(chosen: list[tuple[int, int]]) -> PromptSet:
        prompts = tuple([{"role": "user", "content": instruction.format(a=a, b=b)}] for a, b in chosen)
        return PromptSet(prompts, tuple(str(a + b) for a, b in chosen))

    if rewards is None:
        rewards = {"last_int_match": 1.0}
        if format_weight > 0:
            rewards["int_format"] = float(format_weight)
    return TextTask(
        name="arith_chat",
        train=rows(pairs[n_eval : n_eval + n_train]),
        eval=rows(pairs[:n_eval]),
        rewards=rewards,
        accuracy="last_int_match",
        alphabet="0123456789+. " + "".join(sorted(set(instruction) - set("{}"))),
        max_new_tokens=max_new_tokens,
    )


CHAIN_CHAT_INSTRUCTION = "Compute {expr}. Write each step, then the answer."


def chain_expression(terms: Sequence[int], ops: Sequence[str]) -> tuple[str, list[str], int]:
    """``"a + b - c"``, its worked steps (``["a + b = s", "s - c = r"]``) and the result."""
    expr, total, steps = str(terms[0]), int(terms[0]), []
    for op, t in zip(ops, terms[1:], strict=True):
        nxt = total + t if op == "+" else total - t
        steps.append(f"{total} {op} {t} = {nxt}")
        expr += f" {op} {t}"
        total = nxt
    return expr, steps, total


def chain_chat_task(
    low: int = 1,
    high: int = 30,
    ops: str = "+-",
    n_train: int = 2000,
    n_eval: int = 100,
    split_seed: int = 0,
    instruction: str = CHAIN_CHAT_INSTRUCTION,
    examples: Sequence[Sequence[int]] = ((7, 5, 3), (14, 9, 6)),
    rewards: RewardWeights | None = None,
    max_new_tokens: int = 32,
) -> TextTask:
    """Multi-step arithmetic as a chat turn for pretrained instruct models, where the reply's
    intermediate steps decide the final number: ``Compute 17 + 25 - 8. Write each step, then the
    answer.`` -> ``17 + 25 = 42. 42 - 8 = 34. The answer is 34.``; answer ``34``.

    The expression has ``len(ops) + 1`` terms in ``[low, high]`` joined by ``ops`` in order (each
    ``+`` or ``-``; ``"+-"``: ``a + b - c``). Distinct term tuples are drawn with ``split_seed``:
    the first ``n_eval`` are held out and the next ``n_train`` train. ``examples`` (term tuples
    with the same ``ops``) are shown first as solved turns in the worked format: without them
    SmolLM2-135M-Instruct tends to start a prose derivation that does not reach the answer within
    the budget; with the two defaults it writes the steps in the format and gets 0.12 of the
    held-out problems right (greedy, 32 new tokens: the ``eval.at_start`` evaluation of
    ``python -m benchmarks.run --suite text_chain``), most often losing the chain at a wrong first
    sum or a miscopied number. A held-out tuple as an example is an error.

    Reward: 1 when the last integer of the reply is the result (``last_int_match``, also the
    accuracy). ``chain_steps`` (the fraction of written steps that are right) is logged at weight
    0 (``eval/reward/chain_steps``).
    """
    if not ops or any(op not in "+-" for op in ops):
        raise ConfigError(f"chain_chat: env_kwargs.ops={ops!r} must be one or more of '+' and '-' (e.g. '+-')")
    n_terms = len(ops) + 1
    space = (high - low + 1) ** n_terms
    if low > high or n_eval < 1 or n_train < 1 or n_eval + n_train > space:
        raise ConfigError(
            f"chain_chat: n_train={n_train} + n_eval={n_eval} must be >= 1 each and at most the {space} "
            f"term tuples in [{low}, {high}] (env_kwargs.n_train / env_kwargs.n_eval / low / high)"
        )
    rng = random.Random(split_seed)
    seen: set[tuple[int, ...]] = set()
    chosen: list[tuple[int, ...]] = []
    while len(chosen) < n_eval + n_train:
        t = tuple(rng.randint(low, high) for _ in range(n_terms))
        if t not in seen:
            seen.add(t)
            chosen.append(t)
    held_out = set(chosen[:n_eval])
    demo: list[dict[str, str]] = []
    for ex in examples:
        terms = tuple(int(v) for v in ex)
        if len(terms) != n_terms:
            raise ConfigError(
                f"chain_chat: example {list(terms)} needs {n_terms} terms for ops={ops!r} (env_kwargs.examples)"
            )
        if terms in held_out:
            raise ConfigError(f"chain_chat: example {list(terms)} is a held-out problem (env_kwargs.examples)")
        expr, steps, total = chain_expression(terms, ops)
        demo += [
            {"role": "user", "content": instruction.format(expr=expr)},
            {"role": "assistant", "content": ". ".join(steps) + f". The answer is {total}."},
        ]

    def rows(part: list[tuple[int, ...]]) -> PromptSet:
        prompts, answers = [], []
        for terms in part:
            expr, _, total = chain_expression(terms, ops)
            prompts.append([*demo, {"role": "user", "content": instruction.format(expr=expr)}])
            answers.append(str(total))
        return PromptSet(tuple(prompts), tuple(answers))

    if rewards is None:
        rewards = {"last_int_match": 1.0, "chain_steps": 0.0}
    ev = rows(chosen[:n_eval])
    return TextTask(
        name="chain_chat",
        train=rows(chosen[n_eval:]),
        eval=ev,
        rewards=rewards,
        accuracy="last_int_match",
        # A locally built tiny model reads the prompts untemplated ("user: ...", prompt_text).
        alphabet="".join(sorted(set("0123456789+-=. The answer is").union(*(prompt_text(x) for x in ev.prompts)))),
        max_new_tokens=max_new_tokens,
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
    rewards: RewardWeights | None = None,
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


QUADRATIC_CHAT_INSTRUCTION = "{equation}. Reply with the roots only, in the form x = r1, r2."


def quadratic_chat_task(
    low: int = -9,
    high: int = 9,
    eval_frac: float = 0.2,
    split_seed: int = 0,
    instruction: str = QUADRATIC_CHAT_INSTRUCTION,
    examples: Sequence[Sequence[int]] = ((3, 2),),
    rewards: RewardWeights | None = None,
    max_new_tokens: int = 16,
) -> TextTask:
    """:func:`quadratic_task`'s equations and held-out split (the same 38 held-out equations at
    the defaults) as chat turns for pretrained instruct models: the user message ``Solve x^2 + 4x
    + 3 = 0. Reply with the roots only, in the form x = r1, r2.``, answer ``x = -1, -3``.

    ``examples`` (root pairs of training equations) are shown first as solved turns (user
    question, assistant ``x = 3, 2``): without one, SmolLM2-135M-Instruct starts every reply with
    a restatement of the equation and never states roots within the budget, so every group scores
    0 and GRPO has no signal; with one it answers in the format 97% of the time. A held-out
    equation as an example is an error.

    Free-form replies are scored on the roots they state last (``x = -1 and x = -3`` counts):
    ``quadratic_roots_stated`` (partial credit per root, the reward) and ``quadratic_exact_stated``
    (the accuracy), plus 0.2 x ``quadratic_format`` (the reply is exactly ``x = r1, r2``). The
    from-scratch task's strict metric, ``quadratic_exact``, is logged at weight 0
    (``eval/reward/quadratic_exact``).
    """
    base = quadratic_task(low=low, high=high, eval_frac=eval_frac, split_seed=split_seed)
    demo: list[dict[str, str]] = []
    for roots in examples:
        question, answer = format_quadratic(*(int(r) for r in roots))
        if question in base.eval.prompts:
            raise ConfigError(f"quadratic_chat: example {question!r} is a held-out equation (env_kwargs.examples)")
        demo += [
            {"role": "user", "content": instruction.format(equation=question)},
            {"role": "assistant", "content": answer},
        ]

    def chat(rows: PromptSet) -> PromptSet:
        prompts = tuple([*demo, {"role": "user", "content": instruction.format(equation=p)}] for p in rows.prompts)
        return PromptSet(prompts, rows.answers)

    if rewards is None:
        rewards = {"quadratic_roots_stated": 1.0, "quadratic_format": 0.2, "quadratic_exact": 0.0}
    held_out = chat(base.eval)
    return TextTask(
        name="quadratic_chat",
        train=chat(base.train),
        eval=held_out,
        rewards=rewards,
        accuracy="quadratic_exact_stated",
        # A locally built tiny model reads the prompts untemplated ("user: ...", prompt_text).
        alphabet="".join(sorted(set(QUAD_ALPHABET).union(*(prompt_text(x) for x in held_out.prompts)))),
        max_new_tokens=max_new_tokens,
    )


def _read_jsonl(path: Path, prompt_key: str, answer_key: str) -> tuple[list[Prompt], list[str], list[str]]:
    """Prompts, answers and each row's ``file:line`` of a JSONL file; a bad line is reported as
    ``file:line`` with what is wrong. Each answer is a :class:`RowAnswer` holding the row's keys
    besides the prompt (the answer's own value unconverted), for TRL-form rewards."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such file (env_kwargs.path / env_kwargs.eval_path)")
    prompts: list[Prompt] = []
    answers: list[str] = []
    where: list[str] = []
    try:
        f = path.open(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    with f:
        try:
            lines = list(f)
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from exc
        if not isinstance(row, dict):
            raise DatasetError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
        if prompt_key not in row or answer_key not in row:
            raise DatasetError(
                f"{path}:{lineno}: expected keys {prompt_key!r} and {answer_key!r}, got {sorted(row)} "
                "(env_kwargs.prompt_key / env_kwargs.answer_key name other keys)"
            )
        prompt = row[prompt_key]
        if isinstance(prompt, list):
            if not prompt or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in prompt
            ):
                raise DatasetError(
                    f"{path}:{lineno}: {prompt_key!r} must be a string or a list of "
                    '{"role": ..., "content": ...} messages'
                )
            prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
        elif not isinstance(prompt, str):
            raise DatasetError(f"{path}:{lineno}: {prompt_key!r} must be a string or a list of chat messages")
        prompts.append(prompt)
        answers.append(RowAnswer(str(row[answer_key]), {k: v for k, v in row.items() if k != prompt_key}))
        where.append(f"{path}:{lineno}")
    if not prompts:
        raise DatasetError(f"{path}: no rows")
    return prompts, answers, where


def jsonl_task(
    path: str | None = None,
    eval_path: str | None = None,
    eval_frac: float = 0.1,
    split_seed: int = 0,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    rewards: RewardWeights | None = None,
    accuracy: str = "exact_match",
    alphabet: str | None = None,
    max_new_tokens: int | None = None,
) -> TextTask:
    """Prompt/answer pairs from a local JSONL file, scored by reward functions chosen by name or
    ``module:function`` (positional, or TRL's form with the rows' other keys as keyword lists:
    :mod:`envs.text.rewards`). ``eval_path`` gives an explicit held-out file; otherwise ``eval_frac`` of
    the rows are held out. Each row's prompt is a string or a list of chat messages.

    ``max_new_tokens=None`` (the default) sizes the completion budget to the answers under the
    run's tokenizer (:func:`answer_token_budget`: the longest answer in tokens + EOS, + 16 tokens
    of lead-in for a pretrained model); ``max_new_tokens`` here or ``text.max_new_tokens`` fix it."""
    if not path:
        raise ConfigError(
            "env=text_jsonl needs the prompt file: add +env_kwargs.path=data.jsonl (one JSON object per line "
            'with "prompt" and "answer")'
        )
    p = Path(path).expanduser()
    prompts, answers, where = _read_jsonl(p, prompt_key, answer_key)
    if eval_path:
        train = PromptSet(tuple(prompts), tuple(answers), tuple(where))
        ep, ea, ew = _read_jsonl(Path(eval_path).expanduser(), prompt_key, answer_key)
        ev = PromptSet(tuple(ep), tuple(ea), tuple(ew))
    else:
        train, ev = _split(prompts, answers, eval_frac, split_seed, where)
    if alphabet is None:
        texts = [prompt_text(x) for x in prompts + list(ev.prompts)]
        chars = sorted(set("".join(texts + answers + list(ev.answers))))
        alphabet = "".join(chars)
    from_tokenizer = max_new_tokens is None
    if from_tokenizer:  # the fallback without a tokenizer: characters (a char tokenizer's tokens) + EOS
        max_new_tokens = max(len(a) for a in answers + list(ev.answers)) + 1
    return TextTask(
        name=f"jsonl:{p.name}",
        train=train,
        eval=ev,
        rewards=rewards if rewards is not None else {accuracy: 1.0},
        accuracy=accuracy,
        alphabet=alphabet,
        max_new_tokens=int(max_new_tokens),
        budget_from_tokenizer=from_tokenizer,
        answer_column=answer_key,
    )


TASKS = {
    "arithmetic": arithmetic_task,
    "quadratic": quadratic_task,
    "arith_chat": arith_chat_task,
    "quadratic_chat": quadratic_chat_task,
    "chain_chat": chain_chat_task,
    "text_jsonl": jsonl_task,
}
