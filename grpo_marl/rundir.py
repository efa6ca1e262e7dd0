"""One run per directory: a lock while a run writes there, and no new run into a used directory.

A run holds an exclusive ``fcntl`` lock on ``<run_dir>/.lock`` for as long as it trains (the
kernel drops it when the process ends, however it ends, so a killed run never leaves a stale
lock). A second run into a directory that is locked, or a fresh run (no ``resume=``) into a
directory that already holds a run's files, is refused with :class:`RunDirError` (exit 2) before
anything is written, so two runs never mix their metrics.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from grpo_marl.errors import RunDirError

LOCK_NAME = ".lock"


def existing_run(run_dir: Path) -> str | None:
    """A short description of the run ``run_dir`` already holds, or None when it holds none.

    A directory holds a run once it has metrics, a checkpoint or a summary other than ``failed``
    (a run that failed before logging anything leaves nothing to mix with and may be retried).
    """
    status = None
    try:
        status = json.loads((run_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        pass
    metrics = run_dir / "metrics.jsonl"
    found = ["metrics.jsonl"] if metrics.exists() and metrics.stat().st_size > 0 else []
    ckpt_dir = run_dir / "checkpoints"
    if ckpt_dir.is_dir() and any(ckpt_dir.glob("*.pt")):
        found.append("checkpoints")
    if not found and status in (None, "failed"):
        return None
    return f"summary status: {status}" if status else "it holds " + " and ".join(found)


class RunDirLock:
    """Exclusive lock on a run directory (:meth:`release` is idempotent)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._file: IO[str] | None = None

    def acquire(self) -> RunDirLock:
        import fcntl

        self.run_dir.mkdir(parents=True, exist_ok=True)
        f = open(self.run_dir / LOCK_NAME, "a+")  # noqa: SIM115  (held until release)
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            owner = f.read().strip() or "another process"
            f.close()
            raise RunDirError(
                f"run directory {self.run_dir} is in use by a run still training ({owner}); wait for it to end, "
                "or pass another directory (hydra.run.dir=...)"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor drops the flock
            self._file = None


def check_free(run_dir: str | Path, resume: bool) -> None:
    """Raise :class:`RunDirError` when :func:`claim` would refuse ``run_dir``, writing nothing.

    The CLI calls this before Hydra creates the run directory and writes ``.hydra/`` into it, so a
    refused run leaves a directory exactly as it found it.
    """
    import fcntl

    run_dir = Path(run_dir)
    lock = run_dir / LOCK_NAME
    if lock.exists():
        with open(lock) as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                owner = f.read().strip() or "another process"
                raise RunDirError(
                    f"run directory {run_dir} is in use by a run still training ({owner}); wait for it to end, "
                    "or pass another directory (hydra.run.dir=...)"
                ) from None
    if not resume and run_dir.is_dir():
        held = existing_run(run_dir)
        if held is not None:
            raise RunDirError(
                f"run directory {run_dir} already holds a run ({held}); continue it with resume={run_dir}, "
                "or start a new run in another directory (hydra.run.dir=...)"
            )


#: What Hydra and the lock put into a run directory before the run itself writes anything.
SETUP_FILES = frozenset({".hydra", "train.log", LOCK_NAME})


def discard_unused(run_dir: str | Path) -> bool:
    """Remove a run directory that holds only Hydra's setup files (a run refused with exit 2 after
    Hydra created it), and its parents left empty up to ``runs/``. Returns whether it was removed."""
    import shutil

    run_dir = Path(run_dir)
    try:
        names = {p.name for p in run_dir.iterdir()}
    except OSError:
        return False
    log = run_dir / "train.log"
    if not names <= SETUP_FILES or (log.exists() and log.stat().st_size > 0):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    if "runs" in run_dir.parent.parts:  # Hydra's default layout runs/<env>/...: its empty parents too
        for parent in run_dir.parents:
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break
            if parent.name == "runs":
                break
    return True


def claim(run_dir: str | Path, resume: bool) -> RunDirLock:
    """Lock ``run_dir`` for this run; a fresh run also needs a directory that holds no run yet."""
    run_dir = Path(run_dir)
    lock = RunDirLock(run_dir).acquire()
    if not resume:
        held = existing_run(run_dir)
        if held is not None:
            lock.release()
            raise RunDirError(
                f"run directory {run_dir} already holds a run ({held}); continue it with resume={run_dir}, "
                "or start a new run in another directory (hydra.run.dir=...)"
            )
    return lock
