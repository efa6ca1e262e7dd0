"""Data checked where it enters (issue 27): a text prompt that leaves no room for its completion
is refused when the prompts are tokenized, naming its JSONL row, its length and the keys to
change, before anything is written (it used to fail at the first update as ``IndexError: index
out of range in self``); an observation whose dtype does not fit its space (float images for a
uint8 space, which the vector env would cast to 0s and 1s) stops the run at the first reset with
the conversion to apply."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.text.tasks import jsonl_task
from grpo_marl.vec.spaces import obs_dtype_problem
from tests.conftest import needs

text_extra = needs("transformers", "tokenizers", extra="text")


def _rows(path: Path, long_at: int, n: int = 12) -> Path:
    rows = [{"prompt": f"{i % 5}+1=", "answer": str(i % 5 + 1)} for i in range(n)]
    rows[long_at] = {"prompt": "9" * 80 + "+1=", "answer": "x"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_rows_keep_their_file_and_line_through_the_split(tmp_path: Path) -> None:
    data = _rows(tmp_path / "d.jsonl", long_at=8)
    task = jsonl_task(str(data), eval_frac=0.25)
    both = [task.train, task.eval]
    by_prompt = {s.prompts[i]: s.source(i) for s in both for i in range(len(s))}
    assert by_prompt["9" * 80 + "+1="] == f"{data}:9"
    assert sorted(s.source(i) for s in both for i in range(len(s))) == sorted(f"{data}:{k}" for k in range(1, 13))


@text_extra
def test_too_long_prompt_is_refused_naming_its_row(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    data = _rows(tmp_path / "d.jsonl", long_at=8)
    run_dir = tmp_path / "run"
    proc = run_cli(
        "env=text_jsonl", f"+env_kwargs.path={data}", "+env_kwargs.eval_frac=0", "total_steps=16",
        "algo.num_groups=2", "algo.group_size=2", run_dir=run_dir, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: {data}:9: the train prompt is 83 tokens, but the model's context of 64 tokens minus "
        "text.max_new_tokens=2 leaves 62; use a shorter prompt, a larger model.max_positions, or a smaller "
        "text.max_new_tokens"
    )
    assert not run_dir.exists()  # refused before anything was written
    # the keys it names fix it
    ok = run_cli(
        "env=text_jsonl", f"+env_kwargs.path={data}", "+env_kwargs.eval_frac=0", "total_steps=4",
        "algo.num_groups=1", "algo.group_size=2", "model.max_positions=96", "eval.episodes=1",
        "text.eval_prompts=2", "log.tensorboard=false", "model.save=false", run_dir=run_dir,
    )  # fmt: skip
    assert ok.returncode == 0


def test_obs_dtype_problem_hand_cases() -> None:
    image = spaces.Box(0, 255, (2, 2, 3), np.uint8)
    unit = np.full((2, 2, 3), 0.5, np.float32)
    message = obs_dtype_problem(unit, image)
    assert message is not None and "(obs * 255).astype(np.uint8)" in message
    assert "Box(0.0, 1.0, (2, 2, 3), np.float32)" in message
    assert obs_dtype_problem((unit * 255).astype(np.uint8), image) is None
    assert obs_dtype_problem(np.full((2, 2, 3), 200.0, np.float32), image) is None  # integral floats cast exactly
    assert "truncated" in (obs_dtype_problem(np.full((2, 2, 3), 2.5), image) or "")
    assert obs_dtype_problem(unit, spaces.Box(0.0, 1.0, (2, 2, 3), np.float32)) is None
    assert obs_dtype_problem({"observation": unit, "action_mask": np.ones(2)}, spaces.Dict(
        {"observation": image, "action_mask": spaces.Box(0, 1, (2,), np.int8)}
    )) is not None  # fmt: skip


def test_float_images_for_a_uint8_space_stop_at_the_first_reset(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli(
        "env=tests.custom_envs:float_image", "total_steps=16", "algo.num_groups=2", "algo.group_size=2",
        "vec.max_steps=4", run_dir=run_dir, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["env_steps"] == 0
    expected = (
        "the observation is float32 in [0, 1] but the observation space is Box(0, 255, (36, 36, 3), uint8), so "
        "it would be cast to 0s and 1s; return (obs * 255).astype(np.uint8) from the env, or declare "
        "Box(0.0, 1.0, (36, 36, 3), np.float32)"
    )
    assert summary["error"].startswith("env 'tests.custom_envs:float_image' failed during reset")
    assert summary["error"].endswith(expected) and expected in proc.stderr
