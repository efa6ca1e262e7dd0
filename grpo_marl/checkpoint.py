"""Atomic checkpoints and exact resume.

A checkpoint is written to a temporary file in the same directory and renamed over the old one
(``os.replace`` is atomic on POSIX), so a run killed mid-write keeps its previous checkpoint; a
write that fails (a full disk, a read-only filesystem) removes its partial temporary file, leaves
``last.pt`` and ``prev.pt`` as they were and raises :class:`~grpo_marl.errors.FilesystemError` naming the file and what to do. With
``keep_previous`` (what the trainer uses) the checkpoint it replaces stays beside it as ``prev.pt``
(hard-linked first, so ``last.pt`` exists at every instant). :func:`load_checkpoint` on a run
directory reads ``last.pt`` and, when that file is truncated, corrupt or not a checkpoint, says so
by name and falls back to ``prev.pt``; with neither usable it raises :class:`CheckpointError`.
Besides weights and optimizer state it stores every RNG the run draws from (torch, numpy, python,
the collector's own generator), which is what makes interrupted+resumed equal uninterrupted.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_marl.errors import CheckpointError, FilesystemError, filesystem_message

CHECKPOINT_NAME = "last.pt"
PREVIOUS_NAME = "prev.pt"
#: Keys every trainer checkpoint holds; a file without them is another program's.
REQUIRED_KEYS = ("modules", "optimizer", "counters")


def rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # This process's device only: get_rng_state_all() would create a context on every GPU
        # from every torchrun rank.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):  # older checkpoints: one state per visible GPU
            torch.cuda.set_rng_state_all(cuda)
        else:
            torch.cuda.set_rng_state(cuda)


def atomic_save(obj: Any, path: str | Path, keep_previous: bool = False) -> None:
    """``torch.save`` to ``path`` so that readers only ever see a complete file.

    ``keep_previous``: the file being replaced is kept as ``prev.pt`` beside it (rotation).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.exists():
            _keep_as_previous(path)
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)  # a partial file would only take the space a later write needs
        message = filesystem_message(exc, path)
        if message is not None and not isinstance(exc, FilesystemError):
            raise FilesystemError(message) from exc  # torch hides ENOSPC behind "unexpected pos"
        raise


def _keep_as_previous(path: Path) -> None:
    """Make ``prev.pt`` a copy of ``path`` atomically (a hard link where the filesystem allows)."""
    prev = path.with_name(PREVIOUS_NAME)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{PREVIOUS_NAME}.", suffix=".tmp")
    os.close(fd)
    try:
        os.unlink(tmp)
        try:
            os.link(path, tmp)
        except OSError:
            import shutil

            shutil.copyfile(path, tmp)
        os.replace(tmp, prev)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints" / CHECKPOINT_NAME


def previous_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints" / PREVIOUS_NAME


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", run: bool = True) -> dict[str, Any]:
    """Load one checkpoint file; any failure is a :class:`CheckpointError` naming the file.

    ``run``: the file must be a trainer checkpoint (``modules``, ``optimizer``, ``counters``).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}; was the run started with checkpointing on?")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # truncated zip, garbage bytes, unpickling errors, ...
        reason = str(exc).splitlines()[0] if str(exc) else ""
        reason = reason.split(". ", 1)[0][:160]  # torch's zip errors go on for lines
        raise CheckpointError(
            f"{path} is unreadable ({path.stat().st_size} bytes; {type(exc).__name__}: {reason})"
        ) from exc
    if run and (not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS)):
        found = sorted(state)[:6] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{path} is not a grpo_marl checkpoint (expected keys {list(REQUIRED_KEYS)}, found {found})"
        )
    return state


def usable_checkpoint(
    run_dir: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[dict[str, Any], Path, list[str]]:
    """``(state, path, problems)``: ``last.pt`` if it loads, else ``prev.pt``; ``problems`` names
    every file that was skipped and why. Raises :class:`CheckpointError` when neither is usable."""
    problems: list[str] = []
    for path in (checkpoint_path(run_dir), previous_path(run_dir)):
        if not path.exists():
            continue
        try:
            return read_checkpoint(path, map_location), path, problems
        except CheckpointError as exc:
            problems.append(str(exc))
    if not problems:
        raise CheckpointError(
            f"no checkpoint at {checkpoint_path(run_dir)}; was the run started with checkpointing on?"
        )
    raise CheckpointError(
        "no usable checkpoint in " + str(Path(run_dir) / "checkpoints") + ":\n  - " + "\n  - ".join(problems)
    )


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint file, or a run directory's usable checkpoint (``last.pt``, else ``prev.pt``
    with a warning on stderr naming what was wrong with ``last.pt``)."""
    path = Path(path)
    if not path.is_dir():
        return read_checkpoint(path, map_location, run=False)
    state, used, problems = usable_checkpoint(path, map_location)
    if problems:
        import sys

        print(f"warning: {'; '.join(problems)}; using {used} instead", file=sys.stderr, flush=True)
    return state
