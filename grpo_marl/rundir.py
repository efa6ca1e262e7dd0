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
import sys
from pathlib import Path
from typing import IO

from grpo_marl.errors import RunDirError, RunDirNotWritableError

LOCK_NAME = ".lock"


# -- commands printed for the user to paste ------------------------------------------------------
def _hydra_reads(text: str, value: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_override(f"k={text}").value()
    except Exception:  # noqa: BLE001  (Hydra's lexer refuses it: non-ASCII, a comma, a quote, ...)
        return False
    return isinstance(parsed, str) and parsed == value


def hydra_quote(value: str, force: bool = False) -> str:
    """``value`` as a Hydra override value: unchanged when Hydra reads it back as it is (plain
    ASCII paths), else quoted (non-ASCII, commas, quotes, ...). Hydra keeps a backslash unless it
    precedes a quote, so only those are doubled."""
    import re

    value = str(value)
    if not force and _hydra_reads(value, value):
        return value
    q = "'" if '"' in value and "'" not in value else '"'
    body = re.sub(r"(\\*)" + q, lambda m: m.group(1) * 2 + "\\" + q, value)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)
    return q + body + q


def paste_override(key: str, value: object) -> str:
    """``key=value`` as one word a POSIX shell passes to the CLI unchanged and Hydra reads back as
    ``value``: Hydra-quoted when Hydra needs it, then shell-quoted when the shell needs it
    (``resume=/tmp/run`` stays as it is; ``resume=/tmp/r é`` prints as ``'resume="/tmp/r é"'``)."""
    import shlex

    return shlex.quote(f"{key}={hydra_quote(str(value))}")


#: CLI keys whose value is a path: an unquoted value Hydra cannot read (non-ASCII, a comma) is quoted.
PATH_KEYS = ("resume", "hydra.run.dir", "hydra.sweep.dir")


def quote_path_overrides(args: list[str]) -> list[str]:
    """``resume=/tmp/r é`` as Hydra needs it (``resume="/tmp/r é"``): Hydra's lexer refuses
    unquoted non-ASCII values, so a path typed (or pasted) unquoted would not run otherwise."""
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") in PATH_KEYS and value and value[0] not in "'\"" and not _hydra_reads(value, value):
            arg = f"{key}={hydra_quote(value)}"
        out.append(arg)
    return out


# -- writable, with room --------------------------------------------------------------------------
def _existing_ancestor(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


#: What to do about an unwritable directory, by command.
ELSEWHERE = "pass hydra.run.dir=<a writable directory>"
COPY_IT = "make it writable, or copy the run directory somewhere writable and {verb} that copy"


def check_writable(run_dir: str | Path, need_bytes: int = 0, advice: str = ELSEWHERE) -> None:
    """Raise :class:`RunDirNotWritableError` (exit 2) when ``run_dir`` (or, when it does not exist
    yet, the directory it would be created in) cannot be written, or has less than ``need_bytes``
    free; writes nothing. ``advice``: what to do (a resume or an evaluation writes into the run
    itself, so for them it is :data:`COPY_IT`, not another ``hydra.run.dir``). ``os.access``
    reports a read-only filesystem even to root."""
    import errno
    import shutil

    run_dir = Path(run_dir)
    try:
        str(run_dir).encode(sys.getfilesystemencoding())
    except UnicodeEncodeError:
        raise RunDirNotWritableError(
            f"run directory {run_dir!r} cannot be encoded in the filesystem encoding "
            f"({sys.getfilesystemencoding()}): run with a UTF-8 locale (e.g. LANG=C.UTF-8) or pass "
            "hydra.run.dir=<an ASCII path>"
        ) from None
    base = _existing_ancestor(run_dir)
    if not base.is_dir():
        raise RunDirNotWritableError(f"run directory {run_dir}: {base} is not a directory; {advice}")
    if not os.access(base, os.W_OK | os.X_OK):
        try:
            st = os.statvfs(base)
            readonly = bool(st.f_flag & os.ST_RDONLY)
        except OSError:
            readonly = False
        what = "is on a read-only file system" if readonly else "is not writable (permission denied)"
        made = "" if base == Path(os.path.abspath(run_dir)) else f" (to create {run_dir} in)"
        raise RunDirNotWritableError(f"run directory {run_dir}: {base}{made} {what}; {advice}")
    if need_bytes > 0:
        free = shutil.disk_usage(base).free
        if free < need_bytes:
            raise RunDirNotWritableError(
                f"run directory {run_dir}: {os.strerror(errno.ENOSPC).lower()} for a checkpoint "
                f"({free // 1024} KiB free in {base}, {need_bytes // 1024} KiB needed): free space"
                + ("" if advice != ELSEWHERE else " or pass hydra.run.dir=<a directory on another disk>")
            )


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
    if not found and status in (None, "failed", "interrupted"):  # interrupted in setup: nothing to mix
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
                f"run directory {run_dir} already holds a run ({held}); continue it with {paste_override('resume', run_dir)}, "
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
                f"run directory {run_dir} already holds a run ({held}); continue it with {paste_override('resume', run_dir)}, "
                "or start a new run in another directory (hydra.run.dir=...)"
            )
    return lock
