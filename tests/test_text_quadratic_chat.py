"""``env=quadratic_chat``: the quadratic task's equations and held-out split as chat turns for
pretrained instruct models, scored on the roots a free-form reply states; trained here through
``model.path`` on a tiny Llama ``.gguf`` with a chat template (no big model in tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envs.text.rewards import REWARDS, stated_roots
from envs.text.tasks import quadratic_chat_task, quadratic_task
from grpo_marl.errors import ConfigError
from tests.conftest import require


def test_same_equations_and_held_out_split_as_quadratic() -> None:
    plain, chat = quadratic_task(), quadratic_chat_task()
    assert (len(chat.train), len(chat.eval)) == (152, 38)
    for ours, theirs in ((chat.train, plain.train), (chat.eval, plain.eval)):
        assert ours.answers == theirs.answers
        questions = [p[-1]["content"] for p in ours.prompts]
        assert questions == [f"{q}. Reply with the roots only, in the form x = r1, r2." for q in theirs.prompts]
    # One solved training equation is shown first as a user/assistant exchange.
    demo = chat.eval.prompts[0][:2]
    assert demo == [
        {"role": "user", "content": "Solve x^2 - 5x + 6 = 0. Reply with the roots only, in the form x = r1, r2."},
        {"role": "assistant", "content": "x = 3, 2"},
    ]
    assert "Solve x^2 - 5x + 6 = 0" in plain.train.prompts
    assert [len(p) for p in quadratic_chat_task(examples=()).eval.prompts] == [1] * 38
    held_out = plain.eval.answers[0]  # "x = 8, 5"
    with pytest.raises(ConfigError, match="held-out"):
        quadratic_chat_task(examples=[[int(v) for v in held_out[4:].split(", ")]])


@pytest.mark.parametrize(
    ("reply", "roots", "credit", "exact", "strict"),
    [
        ("x = -1, -3", [-1, -3], 1.0, 1.0, 1.0),
        ("The roots are x = -3 and x = -1.", [-3, -1], 1.0, 1.0, 0.0),
        ("x = 1, 2 ... so x = -1 or -3", [-1, -3], 1.0, 1.0, 0.0),  # the last statement counts
        ("x = -1, 5", [-1, 5], 0.5, 0.0, 0.0),
        ("x = -1.5", None, 0.0, 0.0, 0.0),
        ("x^2 + 4x + 3 = 0 factors as (x + 1)(x + 3)", None, 0.0, 0.0, 0.0),
    ],
)
def test_stated_roots_rewards(reply: str, roots: Any, credit: float, exact: float, strict: float) -> None:
    assert stated_roots(reply) == roots
    args = ([[{"role": "user", "content": "q"}]], [reply], ["x = -1, -3"])
    assert REWARDS["quadratic_roots_stated"](*args) == [pytest.approx(credit)]
    assert REWARDS["quadratic_exact_stated"](*args) == [exact]
    assert REWARDS["quadratic_exact"](*args) == [strict]


def test_trains_on_a_tiny_chat_model_through_model_path(train: Callable[..., dict], tmp_path: Path) -> None:
    require("gguf", "transformers", "tokenizers", "accelerate", extra="text")
    from tests.gguf_helpers import write_tiny_gguf

    path = write_tiny_gguf(
        tmp_path / "tiny-chat.gguf", max_positions=512
    )  # prompt: template + a solved turn + the question
    s = train(
        tmp_path / "run",
        "env=quadratic_chat",
        f"model.path={path}",
        "total_steps=16",
        "+env_kwargs.max_new_tokens=6",
        "algo.num_groups=2",
        "algo.group_size=4",
        "algo.minibatches=1",
        "text.eval_prompts=4",
        "log.tensorboard=false",
        "checkpoint.every=0",
        "threads=1",
    )
    assert s["text/task"] == "quadratic_chat" and s["text/chat_template"] is True
    assert s["env_steps"] == 16 and s["eval/episodes"] == 4 and s["text/max_new_tokens"] == 6
    assert {"eval/reward/quadratic_roots_stated", "eval/reward/quadratic_format", "eval/reward/quadratic_exact"} <= set(
        s
    )
    assert 0.0 <= s["eval/accuracy"] <= 1.0
