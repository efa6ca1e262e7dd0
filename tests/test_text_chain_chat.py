"""``env=chain_chat``: multi-step arithmetic (``a + b - c``, the steps written out) as chat turns
for pretrained instruct models, the task where credit inside a completion matters; trained here
with prompt groups and with state groups (branching from prefixes) through ``model.path`` on a
tiny Llama ``.gguf`` with a chat template (no big model in tests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from envs.text.rewards import REWARDS, chain_steps_credit
from envs.text.tasks import chain_chat_task, chain_expression
from grpo_marl.errors import ConfigError
from tests.conftest import require


def test_expression_steps_and_result() -> None:
    assert chain_expression((28, 13, 25), "+-") == ("28 + 13 - 25", ["28 + 13 = 41", "41 - 25 = 16"], 16)
    assert chain_expression((5, 9, 2, 7), "-++") == ("5 - 9 + 2 + 7", ["5 - 9 = -4", "-4 + 2 = -2", "-2 + 7 = 5"], 5)


def test_split_is_fixed_disjoint_and_shows_two_worked_turns() -> None:
    task = chain_chat_task()
    assert (len(task.train), len(task.eval)) == (2000, 100)
    assert task.eval.prompts == chain_chat_task().eval.prompts  # deterministic in split_seed
    assert task.eval.prompts != chain_chat_task(split_seed=1).eval.prompts
    questions = {p[-1]["content"] for p in task.eval.prompts}
    assert not questions & {p[-1]["content"] for p in task.train.prompts}
    first = task.eval.prompts[0]
    assert first[:2] == [
        {"role": "user", "content": "Compute 7 + 5 - 3. Write each step, then the answer."},
        {"role": "assistant", "content": "7 + 5 = 12. 12 - 3 = 9. The answer is 9."},
    ]
    assert first[2]["content"] == "Compute 14 + 9 - 6. Write each step, then the answer."
    assert first[-1]["content"] == "Compute 28 + 13 - 25. Write each step, then the answer."
    assert task.eval.answers[0] == "16"
    assert task.accuracy == "last_int_match" and task.rewards == {"last_int_match": 1.0, "chain_steps": 0.0}
    assert [len(p) for p in chain_chat_task(examples=()).eval.prompts[:3]] == [1, 1, 1]


def test_bad_arguments_name_the_key() -> None:
    held_out = chain_chat_task().eval.prompts[0][-1]["content"]  # "Compute 28 + 13 - 25. ..."
    assert "28 + 13 - 25" in held_out
    with pytest.raises(ConfigError, match="held-out problem"):
        chain_chat_task(examples=[[28, 13, 25]])
    with pytest.raises(ConfigError, match=r"needs 3 terms.*env_kwargs.examples"):
        chain_chat_task(examples=[[1, 2]])
    with pytest.raises(ConfigError, match="env_kwargs.ops"):
        chain_chat_task(ops="*")
    with pytest.raises(ConfigError, match="env_kwargs.n_train"):
        chain_chat_task(low=1, high=3, n_train=100)


@pytest.mark.parametrize(
    ("reply", "steps", "right"),
    [
        ("28 + 13 = 41. 41 - 25 = 16. The answer is 16.", 1.0, 1.0),
        ("28 + 13 = 41. 41 - 25 = 14. The answer is 14.", 0.5, 0.0),
        ("28 + 13 = 31. 31 - 25 = 6. The answer is 16.", 0.5, 1.0),  # the final number decides the reward
        ("The answer is 16.", 0.0, 1.0),
        ("I cannot compute that.", 0.0, 0.0),
    ],
)
def test_final_number_reward_and_logged_step_credit(reply: str, steps: float, right: float) -> None:
    assert chain_steps_credit(reply) == steps
    args = ([[{"role": "user", "content": "q"}]], [reply], ["16"])
    assert REWARDS["chain_steps"](*args) == [steps]
    assert REWARDS["last_int_match"](*args) == [right]


@pytest.mark.parametrize("mode", ["seed", "state", "state_train"])
def test_trains_on_a_tiny_chat_model_with_prompt_and_state_groups(
    train: Callable[..., dict], tmp_path: Path, mode: str
) -> None:
    require("gguf", "transformers", "tokenizers", "accelerate", extra="text")
    from tests.gguf_helpers import write_tiny_gguf

    path = write_tiny_gguf(
        tmp_path / "tiny-chat.gguf", max_positions=1024
    )  # template + two solved turns + the question
    s = train(
        tmp_path / "run",
        "env=chain_chat",
        f"model.path={path}",
        "total_steps=16",
        "+env_kwargs.max_new_tokens=6",
        "algo.num_groups=2",
        "algo.group_size=4",
        "algo.minibatches=1",
        f"algo.group_mode={mode.split('_')[0]}",
        f"text.branch_train={mode == 'state_train'}",
        "text.branch_points=1",
        "text.branch_size=2",
        "text.eval_prompts=4",
        "log.tensorboard=false",
        "checkpoint.every=0",
        "threads=1",
    )
    assert s["text/task"] == "chain_chat" and s["text/chat_template"] is True
    assert s["eval/episodes"] == 4 and s["text/max_new_tokens"] == 6
    assert {"eval/reward/last_int_match", "eval/reward/chain_steps"} <= set(s)
    if mode == "seed":
        assert s["env_steps"] == 16
    else:  # every continuation counts as a sampled completion (env steps, sampled tokens)
        rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        updates = [r for r in rows if "rollout/branch_completions" in r]
        branched = sum(r["rollout/branch_completions"] for r in updates)
        assert branched > 0 and s["env_steps"] == 8 * len(updates) + branched  # 2 prompts x 4 per update
        assert all(r["rollout/sampled_tokens"] >= r["rollout/branch_tokens"] > 0 for r in updates)
        if mode == "state_train":  # the continuations are trained rows too
            assert all(r["rollout/trained_rows"] == 8 + r["rollout/branch_completions"] for r in updates)
