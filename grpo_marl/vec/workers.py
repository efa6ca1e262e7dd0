"""A vector env whose envs live in worker processes, each owning a contiguous slice.

For envs whose step costs more than the pipe traffic (and machines with spare cores). Per step
the main process sends one numpy action array per worker and receives one numpy
:class:`~grpo_marl.vec.base.HostStep` per worker (numpy pickles cheaply through the pipes); the
slices become one tensor :class:`~grpo_marl.vec.base.Step` here, once. There is no per-env Python
work here. An env failure inside a worker comes back as the
:class:`~grpo_marl.errors.EnvError` the worker's driver raised (naming env, vector index and
reset seed); a worker that dies is reported the same way.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch import Tensor

from grpo_marl.errors import EnvError
from grpo_marl.vec.base import HostStep, Step, VecEnv, host_actions
from grpo_marl.vec.drivers import Driver

DriverFactory = Callable[[int, int], Driver]  # (n envs, global offset) -> driver


def mp_context() -> str:
    """Start method of env workers: ``GRPO_MARL_MP_CONTEXT`` if set; ``spawn`` once CUDA is
    initialised in this process (forking a CUDA/NCCL process is unsafe); else ``fork`` where
    available (any env factory then works, pickled or not)."""
    ctx = os.environ.get("GRPO_MARL_MP_CONTEXT")
    if ctx:
        return ctx
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "spawn"
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def _worker(conn: Any, factory: DriverFactory, n: int, offset: int) -> None:
    try:
        driver = factory(n, offset)
        conn.send(("ok", (driver.layout, driver.max_episode_steps, driver.supports_snapshot)))
    except BaseException as exc:  # reported to the parent, which raises it
        conn.send(("error", _portable(exc)))
        return
    while True:
        try:
            cmd, args = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if cmd == "close":
            driver.close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(driver, cmd)(*args)))
        except BaseException as exc:
            conn.send(("error", _portable(exc)))


def _portable(exc: BaseException) -> BaseException:
    """The exception itself if it pickles (EnvError does), else an EnvError with its traceback."""
    import pickle

    try:
        pickle.dumps(exc)
        return exc
    except Exception:
        return EnvError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")


class WorkerVec(VecEnv):
    """``num_envs`` envs over ``num_workers`` processes in lock-step."""

    def __init__(
        self, factory: DriverFactory, num_envs: int, num_workers: int, name: str, with_state: bool = False
    ) -> None:
        self.num_envs = num_envs
        self.name = name
        self.with_state = with_state
        num_workers = max(1, min(num_workers, num_envs))
        ctx = mp.get_context(mp_context())
        bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._slices: list[tuple[int, int]] = []
        self.closed = False
        for w in range(num_workers):
            lo, hi = int(bounds[w]), int(bounds[w + 1])
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, factory, hi - lo, lo), daemon=True)  # type: ignore[attr-defined]  # typeshed's BaseContext lacks Process
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
            self._slices.append((lo, hi))
        infos = [self._recv(w) for w in range(num_workers)]
        self.layout, self.max_episode_steps, self.supports_snapshot = infos[0]

    # -- plumbing -------------------------------------------------------------------------------
    def _recv(self, w: int) -> Any:
        try:
            status, payload = self._conns[w].recv()
        except (EOFError, ConnectionResetError, OSError) as exc:
            lo, hi = self._slices[w]
            raise EnvError(
                f"env {self.name!r}: the worker process of vector indices {lo}..{hi - 1} died "
                f"(exit code {self._procs[w].exitcode}); the env crashed the process"
            ) from exc
        if status != "ok":
            raise payload
        return payload

    def _call(self, cmd: str, per_worker_args: list[tuple[Any, ...]], workers: list[int] | None = None) -> list[Any]:
        workers = list(range(len(self._conns))) if workers is None else workers
        for w in workers:
            self._conns[w].send((cmd, per_worker_args[w]))
        return [self._recv(w) for w in workers]

    def _split(self, indices: Sequence[int]) -> tuple[list[list[int]], list[tuple[int, int]]]:
        """Local indices per worker and, per input position, (worker, position in its list)."""
        per: list[list[int]] = [[] for _ in self._slices]
        where: list[tuple[int, int]] = []
        for i in indices:
            for w, (lo, hi) in enumerate(self._slices):
                if lo <= int(i) < hi:
                    where.append((w, len(per[w])))
                    per[w].append(int(i) - lo)
                    break
            else:
                raise IndexError(i)
        return per, where

    # -- API ------------------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int], indices: Sequence[int] | None = None) -> Step:
        seeds = [int(s) for s in seeds]
        if indices is None:
            parts = self._call("reset", [(seeds[lo:hi], None) for lo, hi in self._slices])
            return HostStep.cat(parts).to_step()
        per, where = self._split(indices)
        seed_per: list[list[int]] = [[] for _ in self._slices]
        for (w, _), s in zip(where, seeds, strict=True):
            seed_per[w].append(s)
        busy = [w for w in range(len(per)) if per[w]]
        results = dict(
            zip(busy, self._call("reset", [(seed_per[w], per[w]) for w in range(len(per))], busy), strict=True)
        )
        merged = HostStep.cat([results[w] for w in busy])
        # rows back in the caller's order
        offsets = np.cumsum([0] + [len(per[w]) for w in busy])
        pos = {w: int(offsets[k]) for k, w in enumerate(busy)}
        return merged.rows([pos[w] + j for w, j in where]).to_step()

    def step(self, actions: Tensor) -> Step:
        acts = host_actions(actions)
        return HostStep.cat(self._call("step", [(acts[lo:hi],) for lo, hi in self._slices])).to_step()

    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        if not self.supports_snapshot:
            return super().snapshot(indices)
        per, where = self._split(indices)
        results = self._call("snapshot", [(p,) for p in per])
        return [results[w][k] for w, k in where]

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        if not self.supports_snapshot:
            return super().restore(indices, snaps)
        per, where = self._split(indices)
        snap_per: list[list[Any]] = [[] for _ in self._slices]
        for (w, _), s in zip(where, snaps, strict=True):
            snap_per[w].append(s)
        self._call("restore", list(zip(per, snap_per, strict=True)))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for conn in self._conns:
            try:
                conn.send(("close", ()))
                conn.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
