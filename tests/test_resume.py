"""Exact resume (interrupted + resumed == uninterrupted, bitwise, on CPU), failures that stop a run
while keeping its last good checkpoint, and atomic checkpoint writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grpo_marl.checkpoint import atomic_save, load_checkpoint
from grpo_marl.config import ConfigError
from grpo_marl.errors import CheckpointError, NonFiniteError
from grpo_marl.logging import RunLogger

pytestmark = pytest.mark.usefixtures("single_thread")

TOTAL = 8000  # four or more CartPole updates of 64 early (short) episodes


class SimulatedKill(BaseException):
    """Stands in for SIGKILL: escapes every ``except Exception`` and skips the end-of-run work."""


def common(mode: str) -> list[str]:
    group_mode, rollout = ("seed", "stream") if mode == "stream" else (mode, "batch")
    return [
        "env=cartpole",
        "seed=5",
        "eval.every_steps=1500",
        "eval.episodes=5",
        f"algo.group_mode={group_mode}",
        f"algo.rollout={rollout}",
        "algo.beta=0.01",
        "algo.ref_refresh=2",
        "policy.normalize_obs=true",
        # The "extend total_steps" scenario needs an LR that does not depend on total_steps.
        "algo.lr_schedule=constant",
    ]


def assert_same_state(a: dict, b: dict) -> None:
    for name, state in a["modules"].items():
        for key, tensor in state.items():
            assert torch.equal(tensor, b["modules"][name][key]), f"{name}.{key}"
    opt_a, opt_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert opt_a.keys() == opt_b.keys()
    for k in opt_a:
        for field in opt_a[k]:
            assert torch.equal(opt_a[k][field], opt_b[k][field]), f"optimizer {k}.{field}"
    ref_a, ref_b = a["algo"].get("ref_policy"), b["algo"].get("ref_policy")
    assert (ref_a is None) == (ref_b is None)
    for key in ref_a or {}:
        assert torch.equal(ref_a[key], ref_b[key]), f"ref_policy.{key}"
    for key in ("updates", "env_steps", "next_eval", "steps_to_threshold"):
        assert a["counters"][key] == b["counters"][key], key
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])


def without_time(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not k.startswith("time/")}


def training_only(rec: dict) -> dict:
    """A record without its clocks and evaluations (a run that ended at a smaller budget logged its
    final evaluation where the uninterrupted run had a periodic one)."""
    return {k: v for k, v in rec.items() if not k.startswith(("time/", "eval/"))}


def kill_after(monkeypatch: pytest.MonkeyPatch, n_logs: int) -> None:
    """Kill the run right after its n-th metrics line was written (before that update's checkpoint)."""
    original = RunLogger.log
    calls = {"n": 0}

    def log(self, step, metrics):
        original(self, step, metrics)
        calls["n"] += 1
        if calls["n"] == n_logs:
            raise SimulatedKill()

    monkeypatch.setattr(RunLogger, "log", log)


@pytest.mark.parametrize("mode", ["seed", "state", "stream"])
def test_killed_and_resumed_equals_uninterrupted(
    train, tmp_path: Path, monkeypatch, mode: str, read_metrics, load_checkpoint
) -> None:
    full, killed, extended = tmp_path / "full", tmp_path / "killed", tmp_path / "extended"
    ref = train(full, *common(mode), f"total_steps={TOTAL}", "checkpoint.every=2")

    # Killed after the 3rd update was logged; the last checkpoint is from update 2.
    with monkeypatch.context() as m:
        kill_after(m, 3)
        with pytest.raises(SimulatedKill):
            train(killed, *common(mode), f"total_steps={TOTAL}", "checkpoint.every=2")
    assert load_checkpoint(killed)["counters"]["updates"] == 2
    assert len(read_metrics(killed)) == 3 and not (killed / "summary.json").exists()
    resumed = train(killed, f"resume={killed}")

    # Stopped early at a smaller budget, then extended to the full one.
    train(extended, *common(mode), "total_steps=3000", "checkpoint.every=1")
    extended_summary = train(extended, f"resume={extended}", f"total_steps={TOTAL}")

    final = load_checkpoint(full)
    assert final["counters"]["updates"] >= 4
    assert_same_state(final, load_checkpoint(killed))
    assert_same_state(final, load_checkpoint(extended))
    for summary in (resumed, extended_summary):
        for key in ("env_steps", "updates", "eval/return_mean", "eval/return_std"):
            assert summary[key] == ref[key], key
    # The resumed run's log replaces the lines written after its checkpoint: same records.
    assert [without_time(r) for r in read_metrics(killed)] == [without_time(r) for r in read_metrics(full)]
    ref_train = [training_only(r) for r in read_metrics(full) if "train/updates" in r]
    assert [training_only(r) for r in read_metrics(extended) if "train/updates" in r] == ref_train
    steps = [r["step"] for r in read_metrics(extended)]
    assert steps == sorted(set(steps))  # every step once, the first leg's final evaluation included


def test_resume_refuses_changed_settings(train, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(run_dir, "env=cartpole", "total_steps=500", "eval.episodes=2")
    with pytest.raises(ConfigError, match="algo.lr cannot change when resuming"):
        train(run_dir, f"resume={run_dir}", "algo.lr=0.1")
    with pytest.raises(ConfigError, match="pass the directory of a run that wrote at least one checkpoint"):
        train(tmp_path / "other", f"resume={tmp_path / 'nothing_here'}")


def test_non_finite_observation_stops_and_keeps_checkpoint(
    run_cli, tmp_path: Path, read_metrics, load_checkpoint
) -> None:
    run_dir = tmp_path / "nan"
    proc = run_cli(
        "env=tests.custom_envs:nan_cartpole",
        "vec.vectorization=sync",
        "algo.num_groups=2",
        "algo.group_size=2",
        "checkpoint.every=1",
        "total_steps=100000",
        "eval.every_steps=0",
        run_dir=run_dir,
        check=False,
    )
    assert proc.returncode == 1
    assert "'tests.custom_envs:nan_cartpole'" in proc.stderr and "non-finite observation" in proc.stderr
    assert f"last good checkpoint is kept in {run_dir}" in proc.stderr
    assert "Traceback" not in proc.stderr
    ckpt = load_checkpoint(run_dir)
    assert ckpt["counters"]["updates"] >= 1
    assert all(torch.isfinite(t).all() for t in ckpt["modules"]["policy"].values())
    assert len(read_metrics(run_dir)) == ckpt["counters"]["updates"]  # every logged update was saved
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "non-finite observation" in summary["error"]
    assert summary["env_steps"] >= ckpt["counters"]["env_steps"]


def test_non_finite_reward_stops_and_keeps_checkpoint(train, tmp_path: Path, load_checkpoint) -> None:
    run_dir = tmp_path / "nan_reward"
    with pytest.raises(NonFiniteError, match="non-finite reward"):
        train(
            run_dir,
            "env=tests.custom_envs:nan_cartpole",
            "+env_kwargs.after=60",
            "+env_kwargs.where=reward",
            "vec.vectorization=sync",
            "algo.num_groups=2",
            "algo.group_size=2",
            "checkpoint.every=1",
            "total_steps=100000",
            "eval.every_steps=0",
        )
    assert load_checkpoint(run_dir)["counters"]["updates"] >= 1
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


def test_non_finite_reward_of_a_multi_agent_env_stops_and_keeps_checkpoint(
    train, tmp_path: Path, load_checkpoint
) -> None:
    """The multi-agent path has the same finite checks as the single-agent one: a PettingZoo env
    whose reward turns NaN stops the run naming the env, with ``status: failed``."""
    run_dir = tmp_path / "nan_marl"
    with pytest.raises(NonFiniteError, match=r"env 'tests.failing_envs:nan_marl' returned a non-finite reward"):
        train(
            run_dir,
            "env=tests.failing_envs:nan_marl",
            "+env_kwargs.after=30",
            "algo.num_groups=2",
            "algo.group_size=2",
            "checkpoint.every=1",
            "total_steps=100000",
            "eval.every_steps=0",
        )
    ckpt = load_checkpoint(run_dir)
    assert ckpt["counters"]["updates"] >= 1
    assert all(torch.isfinite(t).all() for t in ckpt["modules"]["policy"].values())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "nan_marl" in summary["error"]


def test_non_finite_loss_stops_and_keeps_checkpoint(train, tmp_path: Path, load_checkpoint) -> None:
    run_dir = tmp_path / "nan_loss"
    with pytest.raises(
        NonFiniteError,
        match="loss became non-finite .*lower algo.lr, set algo.max_grad_norm, or check the env's rewards",
    ):
        train(
            run_dir,
            "env=tests.custom_envs:nan_cartpole",
            "+env_kwargs.after=60",
            "+env_kwargs.where=huge",
            "vec.vectorization=sync",
            "algo.num_groups=2",
            "algo.group_size=2",
            "checkpoint.every=1",
            "total_steps=100000",
            "eval.every_steps=0",
        )
    ckpt = load_checkpoint(run_dir)
    assert ckpt["counters"]["updates"] >= 1
    assert all(torch.isfinite(t).all() for t in ckpt["modules"]["policy"].values())
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


# --------------------------------------------------------------------------- atomic writes
class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_atomic_save_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "last.pt"
    atomic_save({"w": torch.arange(3)}, path)  # creates the directory
    assert torch.equal(load_checkpoint(path)["w"], torch.arange(3))
    assert os.listdir(path.parent) == ["last.pt"]


def test_rotation_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "last.pt"
    for i in range(3):
        atomic_save({"w": torch.full((2,), float(i))}, path, keep_previous=True)
    assert sorted(os.listdir(path.parent)) == ["last.pt", "prev.pt"]  # no temp files
    assert torch.equal(torch.load(path, weights_only=False)["w"], torch.full((2,), 2.0))
    assert torch.equal(torch.load(path.with_name("prev.pt"), weights_only=False)["w"], torch.full((2,), 1.0))


def test_run_dir_falls_back_to_previous_checkpoint(tmp_path: Path, capsys) -> None:
    state = {"modules": {}, "optimizer": {}, "counters": {"updates": 1}}
    path = tmp_path / "checkpoints" / "last.pt"
    atomic_save(state, path, keep_previous=True)
    atomic_save({**state, "counters": {"updates": 2}}, path, keep_previous=True)
    path.write_bytes(path.read_bytes()[:100])  # truncated
    assert load_checkpoint(tmp_path)["counters"]["updates"] == 1
    assert f"{path} is unreadable" in capsys.readouterr().err
    path.with_name("prev.pt").write_text("garbage")
    with pytest.raises(CheckpointError, match="no usable checkpoint") as info:
        load_checkpoint(tmp_path)
    assert str(path) in str(info.value) and str(path.with_name("prev.pt")) in str(info.value)


def test_failed_save_keeps_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    atomic_save({"w": torch.ones(4)}, path)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        # big tensor first, so bytes were already written when pickling fails
        atomic_save({"big": torch.zeros(100_000), "bad": Unpicklable()}, path)
    assert os.listdir(tmp_path) == ["last.pt"]  # no partial temp file left behind
    assert torch.equal(torch.load(path, weights_only=False)["w"], torch.ones(4))


def test_failed_rename_keeps_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    import grpo_marl.checkpoint as checkpoint

    path = tmp_path / "last.pt"
    atomic_save({"w": torch.ones(2)}, path)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_save({"w": torch.zeros(2)}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["last.pt"]
    assert torch.equal(torch.load(path, weights_only=False)["w"], torch.ones(2))


def test_missing_checkpoint_is_explained(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path)


def test_foreign_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    atomic_save({"weights": torch.ones(1)}, tmp_path / "checkpoints" / "last.pt")
    with pytest.raises(CheckpointError, match="is not a grpo_marl checkpoint"):
        load_checkpoint(tmp_path)
