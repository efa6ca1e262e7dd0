"""torchrun failures recorded where the user looks (issue 27): real 2-rank runs (gloo, CPU) in
which rank 1 fails, once while building its envs and once in ``step()``. Every rank writes its own
traceback (``error.rank<N>.log``); ``summary.json`` names the rank that failed first and its
error, not rank 0's view of the broken process group ("Connection closed by peer",
``RemoteRankError``); rank 0's terminal line names that rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.test_distributed import torchrun


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_a_rank_failing_in_setup_stops_all_ranks_and_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = torchrun(
        "env=tests.failing_envs:fails_to_build", "algo.num_groups=2", "algo.group_size=2", "total_steps=400",
        "log.tensorboard=false", f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_rank"] == 1
    assert summary["error"] == "rank 1: SetupFailure: simulator assets not found on rank 1"
    assert summary["error_log"] == str(run_dir / "error.rank1.log")
    assert "SetupFailure: simulator assets not found on rank 1" in (run_dir / "error.rank1.log").read_text()
    assert "Connection closed by peer" not in json.dumps(summary)
    own = (run_dir / "error.rank0.log").read_text()  # rank 0's own traceback: the collective's reaction
    assert "Traceback" in own
    assert set(_error_lines(proc.stderr)) == {  # (the two ranks' lines interleave in either order)
        "error: rank 1: unexpected SetupFailure: simulator assets not found on rank 1",
        "error: rank 0: stopped because rank 1 failed: SetupFailure: simulator assets not found on rank 1 "
        f"(see {run_dir / 'error.rank1.log'})",
    }
    assert f"Full traceback: {run_dir / 'error.rank1.log'}" in proc.stderr
    assert f"Full traceback: {run_dir / 'error.rank0.log'}" in proc.stderr


def test_a_rank_failing_in_step_is_named_with_its_own_traceback(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = torchrun(
        "env=tests.failing_envs:crash_after", "+env_kwargs.rank=1", "algo.num_groups=4", "algo.group_size=2",
        "checkpoint.every=1", "total_steps=100000", "log.tensorboard=false", f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed_rank"] == 1 and summary["error_log"] == str(run_dir / "error.rank1.log")
    assert summary["error"].startswith("rank 1: env 'tests.failing_envs:crash_after' failed during step")
    assert "RemoteRankError" not in summary["error"]
    rank1 = (run_dir / "error.rank1.log").read_text()
    assert "EnvCrash: simulated simulator crash after 150 steps" in rank1
    assert "RemoteRankError" in (run_dir / "error.rank0.log").read_text()
    lines = _error_lines(proc.stderr)
    assert any(line.startswith("error: rank 0: stopped because rank 1 failed: env ") for line in lines), lines
    assert summary["checkpoint"] == str(run_dir / "checkpoints" / "last.pt")  # the last good one is kept


def test_a_slow_failing_rank_is_still_the_one_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's order does not decide who is blamed: rank 0, told by the collective that rank 1
    failed (``RemoteRankError`` with its origin), finds no record from rank 1 (starved, slow) and
    writes rank 1's record on its behalf; rank 1's own late record then replaces it, and a later
    reaction never does."""
    import grpo_marl.train as train_mod
    from grpo_marl.errors import EnvError, RemoteRankError

    monkeypatch.setattr(train_mod, "_RECORD_WAIT_S", 0.05)
    cfg = OmegaConf.create({"env": "cartpole", "algo": {"name": "grpo"}, "seed": 1})
    run_dir = tmp_path / "run"
    own = "env 'cartpole' failed during step: simulated crash"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    reaction = RemoteRankError(f"stopping because another rank failed: rank 1: {own}", origin_rank=1, origin_error=own)
    train_mod._record_failure(run_dir, cfg, reaction, "failed")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed_rank"] == 1 and summary["error"] == f"rank 1: {own}"
    assert summary["error_log"] == str(run_dir / "error.rank1.log")
    assert "RemoteRankError" in (run_dir / "error.rank0.log").read_text()  # rank 0's own traceback
    monkeypatch.setenv("RANK", "1")
    train_mod._record_failure(run_dir, cfg, EnvError(own), "failed")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["failed_rank"], summary["error"]) == (1, f"rank 1: {own}")
    assert own in (run_dir / "error.rank1.log").read_text()
    monkeypatch.setenv("RANK", "0")
    gone = RuntimeError("Connection closed by peer")  # a second reaction: it keeps rank 1's record
    train_mod._record_failure(run_dir, cfg, gone, "failed")
    assert json.loads((run_dir / "summary.json").read_text())["error"] == f"rank 1: {own}"
