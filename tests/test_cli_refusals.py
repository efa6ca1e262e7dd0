"""exit 2 writes nothing, and ``resume=`` makes no directory (README, "When something goes wrong").

Hydra creates ``runs/<env>/<algo>_seed<seed>_<time>/`` with ``.hydra/`` and ``train.log`` before
the task function runs; the CLI's preflight refuses a wrong command before that, and a refusal
found later (while building) removes what Hydra created. Each test runs the real CLI in a
subprocess whose working directory is an empty folder, with Hydra's default run directory, as a
user would, and compares the folder before and after.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _subprocess_env

FAST = ["env=cartpole", "total_steps=1500", "eval.episodes=2", "log.progress=false"]


def train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpo_marl.train", *args],
        cwd=cwd,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (and every directory, as b"<dir>")."""
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else b"<dir>")
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (["env=cartpole", "algo.lr=0"], "algo.lr=0 must be > 0"),  # a bad value (schema)
        (["env=no_such_env"], "no_such_env"),  # an unknown env
        (["env=simple_spread", "algo=grpo", "algo.group_mode=nope"], "algo.group_mode"),  # a bad choice
        # found only when the env is built: the factory refuses the keyword
        (["env=tests.custom_envs:nan_cartpole", "+env_kwargs.bogus=1"], "rejected env_kwargs ['bogus']"),
    ],
)
def test_refused_run_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    proc = train(tmp_path, *args, "log.progress=false")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert tree(tmp_path) == {}, "a refused run left files behind"


def test_refused_run_into_a_finished_run_leaves_it_as_it_was(tmp_path: Path) -> None:
    """Hydra would rewrite the old run's ``.hydra/`` before our check ran; now nothing changes."""
    run_dir = tmp_path / "run"
    assert train(tmp_path, *FAST, f"hydra.run.dir={run_dir}").returncode == 0
    before = tree(tmp_path)
    proc = train(tmp_path, *FAST, "seed=7", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2 and "already holds a run (summary status: completed)" in proc.stderr
    assert tree(tmp_path) == before


def test_resume_makes_no_new_directory(tmp_path: Path) -> None:
    assert train(tmp_path, *FAST, "checkpoint.every=1").returncode == 0
    (run_dir,) = (tmp_path / "runs" / "cartpole").iterdir()  # Hydra's default layout
    hydra_files = tree(run_dir / ".hydra")
    proc = train(tmp_path, f"resume={run_dir}", "total_steps=3000", "log.progress=false")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["cartpole"]
    assert list((tmp_path / "runs" / "cartpole").iterdir()) == [run_dir]
    assert tree(run_dir / ".hydra") == hydra_files, "resume rewrote the run's .hydra/ (its start's command)"
    assert "run dir " + str(run_dir) in proc.stdout


def test_refused_resume_writes_nothing(tmp_path: Path) -> None:
    proc = train(tmp_path, f"resume={tmp_path / 'nothing_here'}")
    assert proc.returncode == 2 and "config.yaml not found" in proc.stderr
    assert tree(tmp_path) == {}


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


@pytest.mark.parametrize(
    "env, module, hint",
    [
        ("gym:LunarLander-v3", "Box2D", 'pip install -e ".[box2d]"'),
        ("gym:ALE/Pong-v5", "ale_py", "pip install ale-py"),
        ("pz:atari/pong-v3", "multi_agent_ale_py", "pip install 'pettingzoo[atari]'"),
        ("pz:butterfly/pistonball-v6", "pymunk", 'pip install -e ".[marl-extra]"'),
    ],
)
def test_missing_env_dependency_exits_2_before_building(tmp_path: Path, env: str, module: str, hint: str) -> None:
    if not _absent(module):
        pytest.skip(f"{module} is installed here: the refusal is for machines without it")
    proc = train(tmp_path, f"env={env}")
    assert proc.returncode == 2, proc.stderr
    assert f"error: env {env!r} needs" in proc.stderr or f"error: env {env!r}:" in proc.stderr
    assert hint in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert tree(tmp_path) == {}
