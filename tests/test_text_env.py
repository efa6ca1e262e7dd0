"""Text env, tasks and reward functions: the Gymnasium face and the batched scoring path."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.text.env import TextEnv
from envs.text.rewards import REWARDS, get_reward, parse_roots
from envs.text.tasks import arithmetic_task, format_quadratic, jsonl_task, quadratic_task


def test_arithmetic_single_digit_is_all_100_and_evaluated_on_all() -> None:
    task = arithmetic_task()
    assert len(task.train) == 100 and task.eval == task.train
    assert "3+5=" in task.train.prompts
    assert task.train.answers[task.train.prompts.index("9+9=")] == "18"
    assert task.max_new_tokens == 3  # two digits + EOS


def test_arithmetic_multi_digit_holds_out_prompts() -> None:
    task = arithmetic_task(digits=2)
    assert len(task.train) + len(task.eval) == 10_000
    assert not set(task.train.prompts) & set(task.eval.prompts)
    assert len(task.eval) == 2000


def test_quadratic_format_matches_seed_example() -> None:
    assert format_quadratic(-1, -3) == ("Solve x^2 + 4x + 3 = 0", "x = -1, -3")
    assert format_quadratic(3, -3) == ("Solve x^2 - 9 = 0", "x = 3, -3")
    assert format_quadratic(0, 1) == ("Solve x^2 - x = 0", "x = 1, 0")
    task = quadratic_task()
    assert len(task.train) + len(task.eval) == 190  # unordered root pairs in -9..9
    assert not set(task.train.prompts) & set(task.eval.prompts)


@pytest.mark.parametrize(
    ("completion", "answer", "roots", "exact", "fmt"),
    [
        ("x = -1, -3", "x = -1, -3", 1.0, 1.0, 1.0),
        ("x = -3, -1", "x = -1, -3", 1.0, 1.0, 1.0),  # any order
        ("x = -1, 5", "x = -1, -3", 0.5, 0.0, 1.0),  # partial credit per root
        ("x = 3", "x = 3, 3", 1.0, 1.0, 1.0),  # double root written once
        ("x = 3, 3, 3", "x = 3, 3", 2 / 3, 0.0, 1.0),  # extra values cost
        ("-1, -3", "x = -1, -3", 0.0, 0.0, 0.0),  # wrong format
    ],
)
def test_quadratic_rewards(completion: str, answer: str, roots: float, exact: float, fmt: float) -> None:
    args = (["p"], [completion], [answer])
    assert REWARDS["quadratic_roots"](*args)[0] == pytest.approx(roots)
    assert REWARDS["quadratic_exact"](*args)[0] == exact
    assert REWARDS["quadratic_format"](*args)[0] == fmt


def test_int_rewards() -> None:
    comps, answers = ["8", " 8 ", "08", "9", "x", ""], ["8"] * 6  # "08" is not canonical
    assert REWARDS["int_match"]([""] * 6, comps, answers) == [1, 1, 0, 0, 0, 0]
    close = REWARDS["int_closeness"]([""] * 6, comps, answers)
    assert close[0] == 1.0 and 0 < close[3] < 1 and close[4] == 0.0
    assert REWARDS["exact_match"]([""] * 6, comps, answers) == [1, 1, 0, 0, 0, 0]
    assert parse_roots("x=1,2") == [1, 2]


def test_int_digits_partial_credit() -> None:
    # Position-wise from the left: the right leading digit of "13" earns credit, "9" none.
    comps = ["13", "1", "19", "9", "", "131"]
    assert REWARDS["int_digits"]([""] * 6, comps, ["13"] * 6) == pytest.approx([1, 0.5, 0.5, 0, 0, 1])


def test_reward_lookup_by_module_function(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("my_text_rewards")

    def length_penalty(prompts, completions, answers, **kw):  # type: ignore[no-untyped-def]
        return [-float(len(c)) for c in completions]

    mod.length_penalty = length_penalty  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_text_rewards", mod)
    assert get_reward("my_text_rewards:length_penalty") is length_penalty
    with pytest.raises(ValueError, match="registered"):
        get_reward("no_such_reward")
    with pytest.raises(ValueError, match="no attribute"):
        get_reward("my_text_rewards:missing")


def test_task_score_weights_and_accuracy() -> None:
    task = arithmetic_task()
    total, per, acc = task.score(["1+2=", "1+2="], ["3", "4"], ["3", "3"])
    assert acc.tolist() == [1.0, 0.0]
    assert total[0] == pytest.approx(2.5)  # int_match 1 + int_digits 1 + 0.5 int_closeness
    assert per["int_digits"][1] == 0.0
    assert total[1] == pytest.approx(0.5 * per["int_closeness"][1])


def test_jsonl_task_with_custom_reward(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    rows = [{"question": f"say {w}", "label": w} for w in ["cat", "dog", "owl", "bee", "ant"]]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = jsonl_task(str(path), prompt_key="question", answer_key="label", eval_frac=0.2)
    assert len(task.train) == 4 and len(task.eval) == 1
    assert set("say cat") <= set(task.alphabet)
    total, _, acc = task.score(["say cat"], ["cat"], ["cat"])
    assert acc[0] == 1.0 and total[0] == 1.0
    with pytest.raises(ValueError, match="expected keys"):
        jsonl_task(str(path))


@pytest.mark.parametrize("task_fn", [arithmetic_task, quadratic_task])
def test_env_passes_gymnasium_checker(task_fn) -> None:  # type: ignore[no-untyped-def]
    env = TextEnv(task_fn(), render_mode="ansi")
    check_env(env, skip_render_check=False)


def test_env_same_seed_same_prompt_and_scoring() -> None:
    env = TextEnv(arithmetic_task(), split="eval", render_mode="ansi")
    p1, info1 = env.reset(seed=7)
    p2, info2 = env.reset(seed=7)
    assert p1 == p2 and info1["index"] == info2["index"]  # the 'seed' group mode
    obs, reward, term, trunc, info = env.step(info1["answer"])
    assert obs == p1  # the observation stays the prompt
    assert term and not trunc and reward == pytest.approx(2.5) and info["accuracy"] == 1.0
    assert info1["answer"] in env.render()
    prompt, info = env.reset(options={"index": 3})
    assert prompt == env.data.prompts[3]
    total, _, acc = env.score_batch(np.array([3, 3]), [env.data.answers[3], "x"])
    assert acc.tolist() == [1.0, 0.0] and total[1] == 0.0


def test_registry_knows_text_envs() -> None:
    from grpo_marl.registry import get_spec, make_env

    for name in ("arithmetic", "quadratic", "text_jsonl"):
        assert get_spec(name).kind == "text"
    env = make_env("arithmetic", digits=1, split="eval")
    assert isinstance(env, TextEnv) and len(env.data) == 100


def test_arith_chat_task_is_conversational_with_a_held_out_split() -> None:
    from envs.text.tasks import arith_chat_task

    task = arith_chat_task()
    assert len(task.train) == 2000 and len(task.eval) == 100
    assert not set(map(str, task.train.prompts)) & set(map(str, task.eval.prompts))
    msg = task.eval.prompts[0]
    assert msg[0]["role"] == "user" and msg[0]["content"].endswith("Reply with the number only.")
    a, b = (int(x) for x in msg[0]["content"].split("Compute ")[1].split(".")[0].split(" + "))
    assert task.eval.answers[0] == str(a + b)
    total, per, acc = task.score(
        [msg] * 3, [f"The sum is {a + b}.", str(a + b + 1), f"{a + b}"], [task.eval.answers[0]] * 3
    )
    assert acc.tolist() == [1.0, 0.0, 1.0] and set(per) == {"last_int_match"}
    env = TextEnv(task, split="eval")
    prompt, _ = env.reset(options={"index": 0})
    assert prompt == "user: " + msg[0]["content"]  # chat prompts are observed as plain text


def test_jsonl_errors_name_file_and_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from grpo_marl.errors import ConfigError, DatasetError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", "answer": 4\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:3: not valid JSON"):
        jsonl_task(str(bad))
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"question": "x", "answer": "y"}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: expected keys 'prompt' and 'answer'"):
        jsonl_task(str(bad))
    bad.write_text('{"prompt": [{"role": "user"}], "answer": "2"}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:1: 'prompt' must be a string or a list of"):
        jsonl_task(str(bad))
    with pytest.raises(DatasetError, match=r"missing\.jsonl: no such file"):
        jsonl_task(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match=r"\+env_kwargs\.path=data\.jsonl"):
        jsonl_task()
    good = tmp_path / "chat.jsonl"
    good.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}) + "\n")
    task = jsonl_task(str(good), eval_frac=0.0)
    assert task.train.prompts[0] == [{"role": "user", "content": "1+1?"}]


def test_reward_failures_name_the_function_and_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_marl.errors import RewardFunctionError, TrainingStopped

    mod = types.ModuleType("user_rewards_for_test")

    def picky(prompts, completions, answers, **kw):  # type: ignore[no-untyped-def]
        return [1.0 / (len(c) - 3) for c in completions]  # raises on a 3-character completion

    def nan_reward(prompts, completions, answers, **kw):  # type: ignore[no-untyped-def]
        return [float("nan") if c == "7" else 0.0 for c in completions]

    mod.picky, mod.nan_reward = picky, nan_reward  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "user_rewards_for_test", mod)
    task = arithmetic_task(rewards={"user_rewards_for_test:picky": 1.0})
    with pytest.raises(RewardFunctionError, match=r"'user_rewards_for_test:picky'.*ZeroDivisionError.*'abc'") as exc:
        task.score(["1+1="] * 3, ["2", "abc", "22"], ["2"] * 3)
    assert isinstance(exc.value, TrainingStopped)  # the run ends with status failed, checkpoint kept
    task = arithmetic_task(rewards={"user_rewards_for_test:nan_reward": 1.0})
    with pytest.raises(RewardFunctionError, match=r"returned nan for completion '7' \(answer '2'\)"):
        task.score(["1+1="] * 2, ["2", "7"], ["2", "2"])


def test_missing_text_extra_is_named_before_anything_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    from omegaconf import OmegaConf

    from envs.text import text_config_errors
    from grpo_marl.errors import MissingExtraError

    cfg = OmegaConf.create({"env": "arithmetic", "env_kind": "text"})
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the text extra were not installed
    with pytest.raises(MissingExtraError, match=r'env=arithmetic .* pip install -e "\.\[text\]"'):
        text_config_errors(cfg)
