"""GRPO learns: the default CartPole command reaches the solve level (greedy eval >= 475 over 20
episodes). Part of the default run; a full run takes ~10 s of training on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.slow
def test_grpo_solves_cartpole(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "cartpole"
    proc = run_cli("env=cartpole", "seed=1", run_dir=run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval/episodes"] >= 20
    assert summary["eval/return_mean"] >= 475.0, proc.stdout
    assert summary["steps_to_threshold"] is not None and summary["steps_to_threshold"] <= summary["env_steps"]
    assert summary["time_to_threshold_s"] is not None
