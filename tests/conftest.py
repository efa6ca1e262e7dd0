"""Shared fixtures for the core test suite.

Two ways to run the trainer, both the real thing:

* ``run_cli(...)``: ``python -m grpo_marl.train`` as a subprocess in the repository root (what a
  user types), for exit codes, messages and the run directory's files. Each call costs an
  interpreter + torch + Hydra start, so the suite keeps these few.
* ``train(...)``: the same ``grpo_marl.train.run`` the CLI calls, in-process, on a config composed
  by Hydra's compose API from the same files: for resume and failure tests that need several runs.

Optional packages: a test that needs one is marked ``@needs("module", extra="<extra>")`` (or calls
``require(...)``) and skips without it, naming ``pip install -e ".[<extra>]"``; every other test runs
on the base install. No test's assertions change with what happens to be installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# ``tests.custom_envs`` must import the same way here as in the CLI subprocesses (cwd = ROOT).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Under pytest-xdist (pyproject's ``-n auto``) each worker gets its share of the cores, and so do
# the trainer subprocesses it starts (torch reads OMP_NUM_THREADS): without this, every worker's
# torch would take all cores and the workers would slow each other down.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _SHARE = max(1, (os.cpu_count() or 1) // _WORKERS)
    torch.set_num_threads(_SHARE)
    os.environ.setdefault("OMP_NUM_THREADS", str(_SHARE))


#: A tiny Llama for text runs (the model config's smallest sizes that still have two heads).
TINY_LM = ("model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module stubbed out (None)
        return False


def _needs_reason(modules: tuple[str, ...], extra: str) -> str | None:
    absent = [m for m in modules if not installed(m)]
    return f'needs {", ".join(absent)}: pip install -e ".[{extra}]"' if absent else None


def needs(*modules: str, extra: str) -> pytest.MarkDecorator:
    """Skip marker for a test (or, as ``pytestmark``, a module) that needs optional ``modules``
    (import names) which the ``extra`` of pyproject.toml installs; the skip names the command.

    The rule it serves: a test either needs an optional package and skips without it, or runs
    without it; no assertion depends on what happens to be installed."""
    reason = _needs_reason(modules, extra)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def require(*modules: str, extra: str) -> None:
    """:func:`needs` inside a test or fixture: skip now when a module is missing."""
    __tracebackhide__ = True  # the skip is reported at the caller's line
    reason = _needs_reason(modules, extra)
    if reason:
        pytest.skip(reason)


def _subprocess_env() -> dict[str, str]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("HYDRA_FULL_ERROR", None)  # test the messages users see, not full tracebacks
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def env_without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """:func:`_subprocess_env` for a Python in which ``modules`` are not installed: a
    ``sitecustomize`` on the path sets them to None in ``sys.modules``, so importing them fails."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    lines = ["import sys"] + [f"sys.modules[{m!r}] = None  # not installed" for m in modules]
    (site / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    env = _subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    return env


#: Wall-clock limit of every subprocess a test starts: a hang fails the test instead of stalling CI.
SUBPROCESS_TIMEOUT = 600


def run_module(
    module: str, args: list[str], run_dir: Path | None = None, check: bool = True, timeout: float = SUBPROCESS_TIMEOUT
) -> subprocess.CompletedProcess:
    """``python -m module args`` in the repository root.

    For ``grpo_marl.train`` adds ``hydra.run.dir=<run_dir>`` (unless it is a ``-m`` sweep) and
    ``log.progress=false``. ``check`` asserts exit code 0 and shows stdout/stderr otherwise;
    ``timeout`` (seconds) ends a hung process (``subprocess.TimeoutExpired`` fails the test).
    """
    args = list(args)
    if module == "grpo_marl.train":
        if "-m" not in args and "--multirun" not in args and run_dir is not None:
            args.append(f"hydra.run.dir={run_dir}")
        args.append("log.progress=false")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session")
def cli() -> Callable[..., subprocess.CompletedProcess]:
    """Session-scoped :func:`run_module` (for module-scoped run fixtures)."""
    return run_module


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """``run_cli(*overrides, run_dir=tmp_path/"run", module="grpo_marl.train", check=True)``."""

    def run(
        *overrides: str, run_dir: Path | None = None, module: str = "grpo_marl.train", check: bool = True
    ) -> subprocess.CompletedProcess:
        return run_module(module, list(overrides), run_dir or tmp_path / "run", check)

    return run


def compose_config(overrides: list[str]) -> Any:
    """Hydra composition of ``grpo_marl/conf`` with ``overrides`` (no env defaults, no validation
    of ranges; a value of the wrong type raises ConfigError): the CLI's and ``fit``'s compose."""
    from grpo_marl.config import compose

    return compose(list(overrides))


def resolved_config(overrides: list[str]) -> Any:
    """What the CLI trains with: composition + env defaults under the overrides + validation."""
    from grpo_marl.config import resolve_config

    return resolve_config(compose_config(overrides), list(overrides))


@pytest.fixture
def train() -> Callable[..., dict]:
    """``train(run_dir, *overrides)`` -> summary dict, via ``grpo_marl.train.run`` in-process."""
    from grpo_marl.train import run

    def go(run_dir: Path, *overrides: str) -> dict:
        ov = [*overrides, "log.progress=false"]
        return run(compose_config(ov), ov, Path(run_dir))

    return go


@pytest.fixture
def single_thread() -> Iterator[None]:
    """One intra-op thread, as the trainer uses for MLP control tasks: small forwards on a shared
    2-core machine are slower with more threads, not faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def registry_sandbox() -> Iterator[Any]:
    """Undo every env and env-family registration a test makes (built-ins loaded first so they
    survive the restore)."""
    from grpo_marl import registry
    from grpo_marl.families import FAMILIES

    registry.ENVS.load_modules()
    saved = registry.ENVS.state(), FAMILIES.state()
    try:
        yield registry
    finally:
        registry.ENVS.restore(saved[0])
        FAMILIES.restore(saved[1])


def _read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _load_checkpoint(run_dir: Path) -> dict:
    return torch.load(Path(run_dir) / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)


@pytest.fixture
def read_metrics() -> Callable[[Path], list[dict]]:
    """``read_metrics(run_dir)`` -> the records of ``metrics.jsonl``."""
    return _read_metrics


@pytest.fixture
def load_checkpoint() -> Callable[[Path], dict]:
    """``load_checkpoint(run_dir)`` -> the dict saved in ``checkpoints/last.pt``."""
    return _load_checkpoint


@pytest.fixture
def compose() -> Callable[[list[str]], Any]:
    return compose_config


@pytest.fixture
def resolve() -> Callable[[list[str]], Any]:
    return resolved_config
