"""How a run ends, driven through the CLI as a user would (README, "When something goes wrong").

exit 2: configuration or inputs wrong, nothing built or written; exit 1: failed during training,
``summary.json`` ``status: failed``, the last good checkpoint named (or "no checkpoint yet"), the
traceback in ``error.log``; exit 130 / 143: SIGINT / SIGTERM, checkpoint at the update boundary,
``status: interrupted``, and ``resume=`` continues. Every case also checks that checkpoints and
metrics are intact. Budgets are tiny CartPole runs (seconds each).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, _subprocess_env, env_without, needs

TIMEOUT = 300  # seconds per CLI call: a hang fails the test instead of stalling the suite
FAST = ["env=cartpole", "eval.episodes=2", "eval.every_steps=0", "log.progress=false"]


def cli(*args: str, run_dir: Path | None = None, module: str = "grpo_marl.train", env: dict | None = None):
    if run_dir is None and module == "grpo_marl.train":
        import tempfile  # resume=DIR: Hydra still makes a (then unused) dir of its own; keep it out of the repo

        run_dir = Path(tempfile.mkdtemp(prefix="grpo_marl_hydra_"))
    extra = [f"hydra.run.dir={run_dir}"] if run_dir is not None else []
    return subprocess.run(
        [sys.executable, "-m", module, *args, *extra],
        cwd=ROOT,
        env=env or _subprocess_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def start(*args: str, run_dir: Path, session: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_marl.train", *args, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=_subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=session,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"run ended (exit {proc.returncode}) before {path} appeared:\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.1)


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def train_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/updates" in r]


def counters(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)["counters"]


def assert_metrics_match_checkpoint(run_dir: Path) -> None:
    """One record per update 1..N, strictly increasing steps, N = the last checkpoint's updates."""
    records = train_records(run_dir)
    steps = [r["step"] for r in records]
    assert [r["train/updates"] for r in records] == list(range(1, len(records) + 1))
    assert steps == sorted(set(steps)), "duplicate or out-of-order steps"
    c = counters(run_dir / "checkpoints" / "last.pt")
    assert c["updates"] == len(records) and c["env_steps"] == steps[-1]


# -- exit 2: wrong input, nothing built or written --------------------------------------------------
def test_wrong_config_exits_2_naming_the_key_and_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = cli(*FAST, "algo=mappo", "vec.max_steps=0", run_dir=run_dir)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: invalid configuration:")
    assert (
        "algo=mappo trains multi-agent PettingZoo envs and VMAS scenarios only" in proc.stderr
        and "use algo=grpo or algo=ppo" in proc.stderr
    )
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) <= 3
    assert not run_dir.exists()  # refused before Hydra creates the run dir


def test_debug_flag_adds_the_traceback(tmp_path: Path) -> None:
    env = {**_subprocess_env(), "HYDRA_FULL_ERROR": "1"}
    proc = cli(*FAST, "threads=-3", run_dir=tmp_path / "run", env=env)
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and "threads=-3 must be >= 0" in proc.stderr


# -- exit 1: failed during training ---------------------------------------------------------------
NAN = ["env=tests.custom_envs:nan_cartpole", "vec.vectorization=sync", "algo.num_groups=2", "algo.group_size=2"]


def test_failure_names_the_last_good_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "nan"
    proc = cli(*NAN, "checkpoint.every=1", "total_steps=100000", "eval.every_steps=0", "log.progress=false",
               run_dir=run_dir)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    ckpt = run_dir / "checkpoints" / "last.pt"
    c = counters(ckpt)
    assert "non-finite observation" in proc.stderr
    assert f"The last good checkpoint is kept in {ckpt} (update {c['updates']}" in proc.stderr
    assert f"continue with resume={run_dir}" in proc.stderr
    assert f"Full traceback: {run_dir / 'error.log'}" in proc.stderr and "Traceback" not in proc.stderr
    assert "Traceback (most recent call last)" in (run_dir / "error.log").read_text()
    s = summary(run_dir)
    assert s["status"] == "failed" and "non-finite observation" in s["error"]
    assert s["checkpoint"] == str(ckpt) and s["error_log"] == str(run_dir / "error.log")
    assert_metrics_match_checkpoint(run_dir)


def test_failure_before_the_first_checkpoint_says_so(tmp_path: Path) -> None:
    run_dir = tmp_path / "nan0"
    proc = cli(*NAN, "checkpoint.every=0", "total_steps=100000", "log.progress=false", run_dir=run_dir)
    assert proc.returncode == 1, proc.stderr
    assert "No checkpoint yet: the run failed before its first checkpoint." in proc.stderr
    s = summary(run_dir)
    assert s["status"] == "failed" and s["checkpoint"] is None
    assert not (run_dir / "checkpoints").exists()


# -- exit 130 / 143: interrupted --------------------------------------------------------------------
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_at_the_update_boundary_and_resume_finishes(tmp_path: Path, sig: int, code: int) -> None:
    run_dir = tmp_path / "run"
    proc = start(*FAST, "total_steps=20000000", "checkpoint.every=1", run_dir=run_dir)
    wait_for(run_dir / "checkpoints" / "last.pt", proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == code, err
    name = signal.Signals(sig).name
    assert f"interrupted by {name}: checkpoint saved at update" in err
    assert f"continue with: python -m grpo_marl.train resume={run_dir}" in err
    assert "Traceback" not in err
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["updates"] == counters(run_dir / "checkpoints" / "last.pt")["updates"]
    assert "eval/return_mean" not in s  # no final evaluation: the user asked to stop
    assert_metrics_match_checkpoint(run_dir)  # the checkpoint is at the update boundary, nothing lost
    interrupted_at = s["env_steps"]
    if sig == signal.SIGTERM:
        return  # resume is the same after either signal; check it once
    # resume to a budget past wherever the signal found it (a fast machine trains thousands of
    # steps between the first checkpoint and the signal)
    target = interrupted_at + 6000
    done = cli(f"resume={run_dir}", f"total_steps={target}", "log.progress=false")
    assert done.returncode == 0, done.stderr
    s = summary(run_dir)
    assert s["status"] == "completed" and s["env_steps"] >= target > interrupted_at
    assert_metrics_match_checkpoint(run_dir)


def test_ctrl_c_at_a_terminal_with_env_worker_processes(tmp_path: Path) -> None:
    """Ctrl-C signals the whole process group, env worker processes included: the run still stops
    once, at the update boundary, as interrupted (not as a worker failure)."""
    run_dir = tmp_path / "run"
    proc = start(*FAST, "total_steps=20000000", "checkpoint.every=1", "vec.vectorization=async", run_dir=run_dir,
                 session=True)  # fmt: skip
    try:
        wait_for(run_dir / "checkpoints" / "last.pt", proc)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.count("SIGINT received") == 1 and "Traceback" not in err
    assert summary(run_dir)["status"] == "interrupted"
    assert_metrics_match_checkpoint(run_dir)


# -- run directories --------------------------------------------------------------------------------
def test_a_finished_runs_directory_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert cli(*FAST, "total_steps=500", run_dir=run_dir).returncode == 0
    before = (run_dir / "metrics.jsonl").read_bytes()
    proc = cli(*FAST, "total_steps=500", run_dir=run_dir)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: run directory {run_dir} already holds a run (summary status: completed); continue it with "
        f"resume={run_dir}, or start a new run in another directory (hydra.run.dir=...)"
    )
    assert (run_dir / "metrics.jsonl").read_bytes() == before  # no mixed metrics
    assert summary(run_dir)["status"] == "completed"


def test_a_directory_in_use_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = start(*FAST, "total_steps=20000000", "checkpoint.every=1", run_dir=run_dir)
    try:
        wait_for(run_dir / "checkpoints" / "last.pt", first)
        proc = cli(*FAST, "total_steps=500", run_dir=run_dir)
        assert proc.returncode == 2
        assert f"error: run directory {run_dir} is in use by a run still training (pid {first.pid})" in proc.stderr
        resumed = cli(f"resume={run_dir}", "log.progress=false")  # resuming a live run is refused too
        assert resumed.returncode == 2 and "is in use by a run still training" in resumed.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=TIMEOUT)
    assert first.returncode == 143
    assert_metrics_match_checkpoint(run_dir)  # only the first run wrote there


# -- checkpoints ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run stopped early (total_steps=3000, checkpoint every update): last.pt and prev.pt."""
    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    proc = cli(*FAST, "total_steps=3000", "checkpoint.every=1", "algo.lr_schedule=constant", run_dir=run_dir)
    assert proc.returncode == 0, proc.stderr
    return run_dir


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def test_corrupt_last_checkpoint_falls_back_to_the_previous(stopped_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(stopped_run, tmp_path / "run")
    last, prev = run_dir / "checkpoints" / "last.pt", run_dir / "checkpoints" / "prev.pt"
    prev_counters = counters(prev)
    last.write_bytes(last.read_bytes()[:1000])  # truncated
    proc = cli(f"resume={run_dir}", "total_steps=6000", "log.progress=false")
    assert proc.returncode == 0, proc.stderr
    assert f"warning: {last} is unreadable (1000 bytes;" in proc.stderr
    assert f"Resuming from {prev} instead (update {prev_counters['updates']}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (run_dir / "checkpoints" / "last.pt.bad").stat().st_size == 1000  # kept, not deleted
    assert summary(run_dir)["status"] == "completed"
    assert_metrics_match_checkpoint(run_dir)  # lines after prev.pt's step were replaced, not duplicated


def test_foreign_checkpoint_is_named(stopped_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(stopped_run, tmp_path / "run")
    other = cli(*FAST, "total_steps=500", "seed=9", run_dir=tmp_path / "other")
    assert other.returncode == 0
    last = run_dir / "checkpoints" / "last.pt"
    (tmp_path / "other" / "checkpoints" / "last.pt").replace(last)
    proc = cli(f"resume={run_dir}", "total_steps=6000", "log.progress=false")
    assert proc.returncode == 0, proc.stderr
    assert f"{last} belongs to another run (env=cartpole, algo=grpo, seed=9; this run: env=cartpole" in proc.stderr
    assert_metrics_match_checkpoint(run_dir)


def test_no_usable_checkpoint_exits_2_naming_each_file(stopped_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(stopped_run, tmp_path / "run")
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    for name in ("last.pt", "prev.pt"):
        (run_dir / "checkpoints" / name).write_text("not a checkpoint")
    proc = cli(f"resume={run_dir}", "log.progress=false")
    assert proc.returncode == 2
    assert f"error: resume={run_dir}: no usable checkpoint in {run_dir / 'checkpoints'}:" in proc.stderr
    for name in ("last.pt", "prev.pt"):
        assert f"{run_dir / 'checkpoints' / name} is unreadable (16 bytes;" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics


# -- registry ---------------------------------------------------------------------------------------
def test_pz_ids_train(tmp_path: Path) -> None:
    run_dir = tmp_path / "pursuit"
    proc = cli("env=pz:sisl/pursuit-v5", "+env_kwargs.max_cycles=10", "+env_kwargs.x_size=8", "+env_kwargs.y_size=8",
               "+env_kwargs.n_pursuers=2", "+env_kwargs.n_evaders=2", "algo.num_groups=2", "algo.group_size=2",
               "total_steps=200", "eval.episodes=1", "log.progress=false", run_dir=run_dir)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = summary(run_dir)
    assert s["env"] == "pz:sisl/pursuit-v5" and s["status"] == "completed" and s["env_steps"] >= 200


def in_process(main, args: list[str], capsys) -> tuple[int, str]:
    """The same ``main`` a command runs, called in-process (cheaper than an interpreter start)."""
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code), capsys.readouterr().err


def test_turn_based_pz_game_exits_2(tmp_path: Path) -> None:
    proc = cli("env=pz:classic/tictactoe-v3", "log.progress=false", run_dir=tmp_path / "run")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: env 'pz:classic/tictactoe-v3' is a turn-based game (agents act one at a time), so it cannot be "
        "stepped as a parallel env; grpo_marl trains simultaneous-move envs (e.g. pz:sisl/pursuit-v5, simple_spread)"
    )


@pytest.mark.parametrize(
    "env, expected",
    [
        ("pz:sisl/nothing-v1", "error: env 'pz:sisl/nothing-v1': PettingZoo has no id 'sisl/nothing-v1'"),
        ("cartpol", "error: unknown env 'cartpol'. Did you mean cartpole? Known envs: acrobot, "),
        ("no_such_pkg.envs:make", "error: env 'no_such_pkg.envs:make': cannot import module 'no_such_pkg.envs'."),
    ],
)
def test_unusable_env_names_exit_2(env: str, expected: str, tmp_path: Path, capsys) -> None:
    from grpo_marl.train import main

    code, err = in_process(main, [f"env={env}", f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and err.startswith(expected), err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    if "Known envs" in expected:
        assert "cartpole, " in err and "simple_spread, " in err  # the known names are listed
        assert "pz:<namespace>/<name>-v<N>" in err and "package.module:factory" in err


@pytest.mark.parametrize(
    "env, vectorization, constructor",
    [
        ("acrobot", "sync", "AcrobotEnv.__init__()"),  # gymnasium.make in this process
        ("acrobot", "async", "AcrobotEnv.__init__()"),  # in the env worker processes
        ("pursuit", "auto", "Pursuit.__init__()"),  # a PettingZoo constructor
    ],
)
def test_env_kwarg_the_env_does_not_take_exits_2_naming_it(
    env: str, vectorization: str, constructor: str, tmp_path: Path, capsys
) -> None:
    from grpo_marl.train import main

    args = [f"env={env}", f"vec.vectorization={vectorization}", "+env_kwargs.colour=1", "total_steps=100"]
    code, err = in_process(main, [*args, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and err.startswith(f"error: env {env!r} rejected env_kwargs ['colour']: {constructor}"), err
    assert "remove or correct the env_kwargs key" in err and "Traceback" not in err


# -- evaluate ---------------------------------------------------------------------------------------
def test_evaluate_refuses_bad_arguments_before_running(stopped_run: Path, tmp_path: Path, capsys) -> None:
    from grpo_marl.evaluate import main

    for args, expected in [
        ([f"run={stopped_run}", "episodes=0"], "error: episodes=0 must be an integer >= 1"),
        ([f"run={stopped_run}", "video_episodes=-1"], "error: video_episodes=-1 must be an integer >= 1"),
        ([f"run={stopped_run}", "video=maybe"], "error: video=maybe must be true or false"),
        ([f"run={tmp_path / 'nothing'}"], f"error: {tmp_path / 'nothing' / 'config.yaml'} not found"),
    ]:
        code, err = in_process(main, args, capsys)
        assert code == 2 and err.startswith(expected), err
        assert len(err.splitlines()) == 1
    assert not (stopped_run / "eval.json").exists()
    proc = cli(f"run={stopped_run}", "episodes=0", module="grpo_marl.evaluate")  # the command itself, once
    assert proc.returncode == 2 and proc.stderr == "error: episodes=0 must be an integer >= 1\n"


@needs("transformers", "tokenizers", extra="text")
def test_evaluate_refuses_video_of_a_text_run(stopped_run: Path, tmp_path: Path, capsys) -> None:
    from grpo_marl.evaluate import main

    text = tmp_path / "text"  # a text run: nothing to render
    text.mkdir()
    (text / "config.yaml").write_text(
        (stopped_run / "config.yaml").read_text().replace("env: cartpole", "env: arithmetic")
    )
    code, err = in_process(main, [f"run={text}", "video=true"], capsys)
    assert code == 2 and err.startswith("error: video=true records "), err
    assert len(err.splitlines()) == 1 and "env 'arithmetic' is of kind 'text'" in err
    assert not (text / "eval.json").exists()


# -- missing optional extras ------------------------------------------------------------------------
def test_missing_extra_is_named_with_the_install_command(tmp_path: Path) -> None:
    env = env_without(tmp_path, "transformers")
    run_dir = tmp_path / "run"
    proc = cli("env=arithmetic", "log.progress=false", run_dir=run_dir, env=env)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    # names the env, the missing module and the command that installs it (wording: grpo_marl.tasks / grpo_marl.text)
    assert err.startswith("error: env") and "arithmetic" in err and "transformers" in err, err
    assert "pip install" in err and ".[text]" in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (run_dir / "config.yaml").exists()
