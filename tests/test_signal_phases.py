"""SIGINT / SIGTERM at each phase of a real run (README, "When something goes wrong").

Each test starts ``python -m grpo_marl.train`` as a subprocess, waits until the run is in the
phase (a file the run or the test env writes, never a blind sleep), sends the signal and checks
the exit code, the message, ``summary.json`` (``status: interrupted`` with the ``phase``), the
checkpoint and what ``resume=`` does afterwards. The update-boundary case (collect / update) and
double signals are in tests/test_failures.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, _subprocess_env
from tests.test_failures import TIMEOUT, assert_metrics_match_checkpoint, counters, summary, wait_for

MARKING = ["env=tests.signal_envs:marking_cartpole", "vec.vectorization=sync", "algo.num_groups=2",
           "algo.group_size=2", "eval.episodes=2", "eval.final_episodes=2", "log.progress=false",
           "log.tensorboard=false"]  # fmt: skip


def env_for(marks: Path, sleep: float = 0.05) -> dict[str, str]:
    marks.mkdir(parents=True, exist_ok=True)
    return {**_subprocess_env(), "SIGNAL_MARK_DIR": str(marks), "SIGNAL_STEP_SLEEP": str(sleep)}


def start(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_marl.train", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def resume(run_dir: Path, *extra: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpo_marl.train", f"resume={run_dir}", "log.progress=false", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip


def eval_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "eval/return_mean" in r]


def test_sigterm_during_setup_exits_at_once(tmp_path: Path) -> None:
    """pursuit 8x8 with its default 30 evaders and 8 pursuers: PettingZoo's constructor searches for
    free cells forever. The signal must end it (nothing trained, nothing to save)."""
    run_dir = tmp_path / "run"
    proc = start("env=pz:sisl/pursuit-v5", "+env_kwargs.x_size=8", "+env_kwargs.y_size=8", "log.progress=false",
                 f"hydra.run.dir={run_dir}", env=_subprocess_env())  # fmt: skip
    wait_for(run_dir / ".lock", proc)  # the run claimed its directory: it is building the env
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 143, err
    assert "SIGTERM received during setup: stopping now; nothing was trained, nothing to save" in err
    assert "interrupted by SIGTERM during setup: nothing was trained; run the command again" in err
    assert "Traceback" not in err
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["phase"] == "setup" and s["checkpoint"] is None
    assert not (run_dir / "checkpoints").exists()


def test_sigint_during_the_final_evaluation_abandons_it_and_resume_redoes_it(tmp_path: Path) -> None:
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    proc = start(*MARKING, "total_steps=100", "eval.every_steps=0", f"hydra.run.dir={run_dir}", env=env_for(marks))
    wait_for(marks / "final_evaluate", proc)  # 2 episodes x up to 500 steps x 0.05 s if not abandoned
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err
    n = counters(run_dir / "checkpoints" / "last.pt")["updates"]
    assert (
        "SIGINT received during final_evaluate: abandoning the final evaluation, keeping the checkpoint of "
        f"update {n}; resume= redoes the final evaluation" in err
    )
    assert f"interrupted by SIGINT: checkpoint saved at update {n}" in err and "Traceback" not in err
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["phase"] == "final_evaluate" and "eval/return_mean" not in s
    assert s["updates"] == n
    assert not eval_records(run_dir)  # the abandoned evaluation left nothing in the metrics

    quick = env_for(marks, sleep=0.0)
    done = resume(run_dir, env=quick)
    assert done.returncode == 0, done.stderr
    s = summary(run_dir)
    assert s["status"] == "completed" and "eval/return_mean" in s
    assert len(eval_records(run_dir)) == 1  # the final evaluation, once, with update 1's record
    assert_metrics_match_checkpoint(run_dir)

    # resuming the completed run: one line, exit 0, nothing appended anywhere
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}
    again = resume(run_dir, env=quick)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == (
        f"{run_dir} already completed ({s['env_steps']} env steps, total_steps=100); nothing to do. "
        "To train further, resume with a larger total_steps=..."
    )
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}
    assert after == before


def test_sigterm_during_a_periodic_evaluation_abandons_it_and_resume_redoes_it(tmp_path: Path) -> None:
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    proc = start(*MARKING, "total_steps=1000000", "eval.every_steps=1", "checkpoint.every=0",
                 f"hydra.run.dir={run_dir}", env=env_for(marks))  # fmt: skip
    wait_for(marks / "evaluate", proc)  # the evaluation after update 1
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 143, err
    assert "SIGTERM received during evaluate: abandoning the evaluation, keeping the checkpoint of update 1" in err
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["phase"] == "evaluate" and s["updates"] == 1
    steps = counters(run_dir / "checkpoints" / "last.pt")["env_steps"]
    # resume to the next update: update 1's record is logged once, with its evaluation redone
    done = resume(run_dir, f"total_steps={steps + 1}", env=env_for(marks, sleep=0.0))
    assert done.returncode == 0, done.stderr
    assert_metrics_match_checkpoint(run_dir)
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert first["train/updates"] == 1 and "eval/return_mean" in first and first["step"] == steps
    assert os.path.exists(run_dir / "checkpoints" / "last.pt")
