"""Atomic checkpoints and exact resume.

A checkpoint is written to a temporary file in the same directory and renamed over the old one
(``os.replace`` is atomic on POSIX), so a run killed mid-write keeps its previous checkpoint.
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

CHECKPOINT_NAME = "last.pt"


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


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to ``path`` so that readers only ever see a complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints" / CHECKPOINT_NAME


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = checkpoint_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; was the run started with checkpointing on?")
    return torch.load(path, map_location=map_location, weights_only=False)
