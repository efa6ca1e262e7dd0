"""Env mistakes and faults end per the contract under every vectorization: a TimeLimit from any
factory is honoured, a missing limit names ``vec.max_steps``, and an env that raises or returns a
malformed observation stops the run with the env, vector index and reset seed named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ENVS = "tests.env_contract_envs"


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_time_limit_wrapper_of_a_custom_factory_caps_episodes(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "capped"
    run_cli(f"env={ENVS}:capped", "total_steps=3000", "algo.num_groups=2", "algo.group_size=4", run_dir=run_dir)
    lengths = [
        json.loads(line).get("rollout/length_mean") for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    lengths = [x for x in lengths if x is not None]
    assert lengths and all(x == 60 for x in lengths)  # the env never ends by itself: the wrapper's 60 steps
    assert _summary(run_dir)["status"] == "completed"


def test_env_without_a_limit_names_vec_max_steps(run_cli, tmp_path: Path) -> None:
    proc = run_cli(f"env={ENVS}:uncapped", "total_steps=1000", run_dir=tmp_path / "u", check=False)
    assert proc.returncode == 2
    assert "vec.max_steps" in proc.stderr and "TimeLimit" in proc.stderr
    capped = run_cli(
        f"env={ENVS}:uncapped",
        "total_steps=500",
        "vec.max_steps=25",
        "algo.num_groups=2",
        "algo.group_size=4",
        run_dir=tmp_path / "u2",
    )
    assert capped.returncode == 0


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_env_exception_in_step_stops_cleanly_naming_env_index_and_seed(run_cli, tmp_path: Path, vectorization) -> None:
    run_dir = tmp_path / vectorization
    proc = run_cli(
        "env=tests.failing_envs:crash_after",
        "+env_kwargs.after=40",
        f"vec.vectorization={vectorization}",
        "algo.num_groups=2",
        "algo.group_size=2",
        "total_steps=5000",
        run_dir=run_dir,
        check=False,
    )
    assert proc.returncode == 1
    message = proc.stderr
    assert "tests.failing_envs:crash_after" in message and "vector index" in message and "reset seed" in message
    assert "simulated simulator crash" in message
    assert "Traceback" not in message  # the traceback goes to the run's error log
    summary = _summary(run_dir)
    assert summary["status"] == "failed" and "vector index" in summary["error"]
    assert (run_dir / "error.log").read_text().count("Traceback") >= 1


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_wrong_observation_shape_is_named(run_cli, tmp_path: Path, vectorization) -> None:
    run_dir = tmp_path / f"shape_{vectorization}"
    proc = run_cli(
        f"env={ENVS}:bad_shape",
        f"vec.vectorization={vectorization}",
        "algo.num_groups=2",
        "algo.group_size=2",
        "total_steps=500",
        run_dir=run_dir,
        check=False,
    )
    assert proc.returncode == 1
    assert "has shape (3,)" in proc.stderr and "vector index 0" in proc.stderr and "reset seed" in proc.stderr
    assert _summary(run_dir)["status"] == "failed"
