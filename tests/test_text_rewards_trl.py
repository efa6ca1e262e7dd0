"""Rewards as TRL users write them (issue 26 item 5): ``f(prompts, completions, **kwargs)`` with the
JSONL row's other columns as keyword lists, next to the positional ``f(prompts, completions,
answers)``; ``None`` where a reward does not apply; a weighted set of ``module:function`` rewards on
the command line; a signature that fits neither form refused when the run starts (exit 2, nothing
written). The user's functions live in tests/outside_pkg/grpo_marl_outside/rewards.py."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envs.text.rewards import POSITIONAL, TRL, bind_reward, reward_weights
from envs.text.tasks import TextTask, arithmetic_task, jsonl_task
from grpo_marl.errors import ConfigError, RewardFunctionError
from tests.conftest import ROOT, TINY_LM, _subprocess_env, needs, resolved_config

OUTSIDE = Path(__file__).parent / "outside_pkg"
R = "grpo_marl_outside.rewards"
text_extra = needs("transformers", "tokenizers", extra="text")
TINY = [
    "algo.num_groups=2",
    "algo.group_size=4",
    "total_steps=8",
    *TINY_LM,
    "log.tensorboard=false",
    "checkpoint.every=0",
    "threads=1",
    "log.progress=false",
]


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The user's rewards module, importable as ``grpo_marl_outside.rewards`` (its record cleared)."""
    monkeypatch.syspath_prepend(str(OUTSIDE))
    import grpo_marl_outside.rewards as mod

    mod.RECORDED.clear()
    yield mod
    mod.RECORDED.clear()


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"prompt": "2+2=", "solution": 4, "level": "easy", "max_chars": 1},
    {"prompt": [{"role": "user", "content": "3+4?"}], "solution": 7, "level": "hard"},
    {"prompt": "1+1=", "solution": 2, "max_chars": 3, "tags": ["x"]},
]


def _cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = _subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(OUTSIDE), env["PYTHONPATH"]])
    return subprocess.run(
        [sys.executable, "-m", "grpo_marl.train", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


# -- which form a function is called in ----------------------------------------------------------
def _pos3(prompts, completions, answers, **kwargs): ...  # type: ignore[no-untyped-def]
def _pos_other_names(p, c, a): ...  # type: ignore[no-untyped-def]
def _pos_args(*args): ...  # type: ignore[no-untyped-def]
def _trl(prompts, completions, **kwargs): ...  # type: ignore[no-untyped-def]
def _trl_kwargs_only(**kwargs): ...  # type: ignore[no-untyped-def]
def _trl_named(completions, answer): ...  # type: ignore[no-untyped-def]
def _trl_column(prompts, completions, solution, **kwargs): ...  # type: ignore[no-untyped-def]


@pytest.mark.parametrize(
    ("fn", "columns", "form"),
    [
        (_pos3, ("answer",), POSITIONAL),
        (_pos3, ("answers",), POSITIONAL),  # the positional form's own signature wins
        (_pos_other_names, ("answer",), POSITIONAL),
        (_pos_args, ("answer",), POSITIONAL),
        (_trl, ("answer",), TRL),
        (_trl_kwargs_only, ("answer",), TRL),
        (_trl_named, ("answer",), TRL),
        (_trl_column, ("solution", "level"), TRL),
        ("int_match", ("answer",), POSITIONAL),
    ],
)
def test_the_signature_decides_the_call(fn: Any, columns: tuple[str, ...], form: str) -> None:
    assert bind_reward(fn, columns).form == form


def test_trl_form_receives_the_jsonl_columns_as_keyword_lists(tmp_path: Path, outside: Any) -> None:
    data = _jsonl(tmp_path / "d.jsonl", ROWS)
    task = jsonl_task(str(data), eval_frac=0.0, answer_key="solution", rewards={f"{R}:record": 1.0, "exact_match": 0.5})
    assert task.columns == ("solution", "level", "max_chars", "tags")
    assert task.rewards == {f"{R}:record": 1.0, "exact_match": 0.5}
    total, per, _ = task.score(list(task.train.prompts), ["4", "7", "x"], list(task.train.answers))
    (call,) = outside.RECORDED
    assert call == {
        "prompts": ["2+2=", [{"role": "user", "content": "3+4?"}], "1+1="],
        # a conversational prompt's completion comes as TRL passes it
        "completions": ["4", [{"role": "assistant", "content": "7"}], "x"],
        # JSON values as in the file; None where a row lacks the key
        "solution": [4, 7, 2],
        "level": ["easy", "hard", None],
        "max_chars": [1, None, 3],
        "tags": [None, None, ["x"]],
    }
    # the positional form next to it still gets the answers as strings
    assert per["exact_match"].tolist() == [1.0, 1.0, 0.0]
    assert total.tolist() == [0.5, 0.5, 0.0]
    # the env's own step (one prompt) passes the same columns
    from envs.text.env import TextEnv

    env = TextEnv(task)
    env.reset(options={"index": 1})
    env.step("7")
    assert outside.RECORDED[-1]["level"] == ["hard"] and outside.RECORDED[-1]["solution"] == [7]
    # the answers that carry the columns survive a pickle (worker processes, checkpoints)
    again = pickle.loads(pickle.dumps(task.train.answers))
    assert again == ("4", "7", "2") and again[0].columns == task.train.answers[0].columns


def test_built_in_tasks_pass_answer_and_positional_rewards_still_work(outside: Any) -> None:
    def legacy(prompts, completions, answers, **kw):  # type: ignore[no-untyped-def]
        return [float(len(c) == len(a)) for c, a in zip(completions, answers, strict=True)]

    task = arithmetic_task(operands=[1, 2], rewards={"int_match": 1.0, f"{R}:record": 1.0})
    prompts, answers = list(task.train.prompts), list(task.train.answers)
    total, per, acc = task.score(prompts, ["2", "3", "0", "4"], answers)
    assert answers == ["2", "3", "3", "4"]
    assert outside.RECORDED == [{"prompts": prompts, "completions": ["2", "3", "0", "4"], "answer": answers}]
    assert per["int_match"].tolist() == acc.tolist() == [1.0, 1.0, 0.0, 1.0] == total.tolist()
    # a callable in the positional form (no signature change for existing code)
    assert bind_reward(legacy).form == POSITIONAL
    assert bind_reward(legacy)(prompts, ["22", "3", "0", "4"], answers, {}) == [0.0, 1.0, 1.0, 1.0]


def test_none_means_the_reward_does_not_apply(tmp_path: Path, outside: Any) -> None:
    data = _jsonl(tmp_path / "d.jsonl", ROWS)
    task = jsonl_task(
        str(data),
        eval_frac=0.0,
        answer_key="solution",
        rewards={f"{R}:solution_match": 1.0, f"{R}:short_enough": 0.5},
        accuracy=f"{R}:short_enough",
    )
    total, per, acc = task.score(list(task.train.prompts), ["4", "77", "2"], list(task.train.answers))
    # row 2 has no max_chars: short_enough is None there, which adds nothing to the total (TRL's
    # nansum over functions), counts as 0 in the function's values and as not correct
    assert per[f"{R}:short_enough"].tolist() == [1.0, 0.0, 1.0]
    assert per[f"{R}:solution_match"].tolist() == [1.0, 0.0, 1.0]
    assert total.tolist() == [1.5, 0.0, 1.5]
    assert acc.tolist() == [1.0, 0.0, 1.0]
    assert all(np.isfinite(v).all() for v in per.values())


def test_an_installed_package_registers_rewards_by_name(tmp_path: Path, outside: Any) -> None:
    """A ``grpo_marl.rewards`` entry point (tests/outside_pkg's ``solution_match``) is a reward
    name like a built-in: found when first asked for, without importing the package by hand."""
    import envs.text.rewards as rewards

    saved = rewards.REWARDS.state()
    rewards.REWARDS.entry_points_loaded = False  # the package was put on the path after startup
    try:
        assert rewards.get_reward("solution_match") is outside.solution_match
        task = jsonl_task(
            str(_jsonl(tmp_path / "d.jsonl", ROWS)), eval_frac=0.0, answer_key="solution", rewards=["solution_match"]
        )
        total, _, _ = task.score(list(task.train.prompts), ["4", "77", "2"], list(task.train.answers))
        assert total.tolist() == [1.0, 0.0, 1.0]
        with pytest.raises(ConfigError, match=r"unknown reward 'solution_mach'.*Did you mean solution_match\?"):
            rewards.get_reward("solution_mach")
    finally:
        rewards.REWARDS.restore(saved)


def test_nan_is_still_refused_and_none_is_not() -> None:
    import envs.text.rewards as rewards

    def maybe(prompts, completions, **kwargs):  # type: ignore[no-untyped-def]
        return [None if c == "skip" else float("nan") if c == "nan" else 1.0 for c in completions]

    rewards.register_reward("maybe_trl")(maybe)
    try:
        task = arithmetic_task(operands=[1], rewards={"maybe_trl": 1.0})
        total, _, _ = task.score(["1+1="], ["skip"], ["2"])
        assert total.tolist() == [0.0]
        with pytest.raises(RewardFunctionError, match="returned nan for completion 'nan'"):
            task.score(["1+1="], ["nan"], ["2"])
    finally:
        rewards.REWARDS.pop("maybe_trl")


def test_weighted_sets_in_both_forms_and_their_refusals() -> None:
    assert reward_weights({"int_match": 1, "m.r:f": 0.5}) == {"int_match": 1.0, "m.r:f": 0.5}
    assert reward_weights(["m.r:f", ["int_match", 0.5]]) == {"m.r:f": 1.0, "int_match": 0.5}
    with pytest.raises(ConfigError, match=r"write the colon as \\:"):
        reward_weights({"m.r": "f: 1.0"})  # Hydra's reading of {m.r:f: 1.0}
    with pytest.raises(ConfigError, match="must be a finite number"):
        reward_weights({"int_match": "high"})
    with pytest.raises(ConfigError, match="listed twice"):
        reward_weights(["int_match", ["int_match", 2]])
    with pytest.raises(ConfigError, match="neither a reward name nor a"):
        reward_weights([["int_match", 1, 2]])
    with pytest.raises(ConfigError, match="at least one reward"):
        reward_weights([])


def test_a_signature_that_fits_neither_form_is_refused_naming_it(tmp_path: Path, outside: Any) -> None:
    data = _jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(ConfigError) as info:
        jsonl_task(str(data), answer_key="solution", rewards={f"{R}:needs_reference": 1.0})
    msg = str(info.value)
    assert msg.startswith(
        f"reward {R}:needs_reference(prompts, completions, reference) cannot be called: it requires 'reference', "
        "which is not a column of the data (columns: solution, level, max_chars, tags)"
    )
    assert "f(prompts, completions, answers)" in msg and "f(prompts, completions, **kwargs)" in msg
    with pytest.raises(ConfigError, match="completion token ids are not passed"):
        bind_reward(lambda prompts, completions, completion_ids: [0.0])
    with pytest.raises(ConfigError, match="unknown reward 'no_such_reward'"):
        TextTask(
            "t",
            arithmetic_task(operands=[1]).train,
            arithmetic_task(operands=[1]).eval,
            {"no_such_reward": 1.0},
            "int_match",
            "0",
            1,
        )


def test_the_list_form_through_hydras_grammar(tmp_path: Path, outside: Any) -> None:
    from envs.text import make_text_env

    data = _jsonl(tmp_path / "d.jsonl", ROWS)
    cfg = resolved_config(
        [
            "env=text_jsonl",
            f"+env_kwargs.path={data}",
            "+env_kwargs.answer_key=solution",
            f"+env_kwargs.rewards=[{R}:solution_match, [{R}:short_enough, 0.5]]",
        ]
    )
    env = make_text_env("text_jsonl", **dict(cfg.env_kwargs))
    assert env.task.rewards == {f"{R}:solution_match": 1.0, f"{R}:short_enough": 0.5}


@text_extra
def test_cli_trains_with_a_weighted_set_of_trl_rewards(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", ROWS * 2)
    proc = _cli(
        tmp_path,
        "env=text_jsonl",
        f"+env_kwargs.path={data}",
        "+env_kwargs.answer_key=solution",
        f"+env_kwargs.rewards={{{R}\\:solution_match: 1.0, {R}\\:short_enough: 0.5, nonempty: 0.1}}",
        f"+env_kwargs.accuracy={R}:solution_match",
        *TINY,
    )
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 8 and summary["updates"] == 1
    assert f"eval/reward/{R}:short_enough" in summary
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*metrics)
    for name in (f"{R}:solution_match", f"{R}:short_enough", "nonempty"):
        assert f"rollout/reward/{name}" in keys
    assert f"{R}:solution_match: 1.0" in (run / "config.yaml").read_text()


def test_cli_refuses_a_bad_signature_and_a_split_key_writing_nothing(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", ROWS)
    common = ["env=text_jsonl", f"+env_kwargs.path={data}", "+env_kwargs.answer_key=solution", *TINY]
    proc = _cli(tmp_path, *common, f"+env_kwargs.rewards=[{R}:needs_reference, [exact_match, 0.5]]")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: reward {R}:needs_reference(prompts, completions, reference) cannot be")
    assert "TRL's form f(prompts, completions, **kwargs)" in proc.stderr
    assert not (tmp_path / "run").exists()
    # what Hydra makes of an unescaped module:function key is refused with the forms that work
    proc = _cli(tmp_path, *common, f"+env_kwargs.rewards={{{R}:solution_match: 1.0}}")
    assert proc.returncode == 2, proc.stderr
    assert f"'+env_kwargs.rewards={{{R}\\:solution_match: 1.0}}'" in proc.stderr
    assert f"'+env_kwargs.rewards=[[{R}:solution_match, 1.0]]'" in proc.stderr
    assert not (tmp_path / "run").exists()
