"""Command-line training: ``python -m grpo_marl.train env=NAME [algo=grpo|ppo] [key=value ...]``.

Hydra composes the config (``-m`` sweeps too); the env's tuned defaults are merged under the
command line; the config is validated before anything is built, so a bad value fails in
milliseconds with what to change instead of minutes into a run.

How a run ends (README, "When something goes wrong"):

* exit 0: trained (``summary.json`` ``status: completed`` or ``threshold_reached``);
* exit 2: the configuration or an input is wrong; one message naming the key / env / file, nothing
  built, nothing written (a :class:`~grpo_marl.errors.UserInputError`);
* exit 1: the run started and failed; summary ``status: failed``, the message, the last good
  checkpoint named (or "no checkpoint yet") and the traceback in ``<run_dir>/error.log``;
* filesystem faults (a full disk, a read-only or unwritable run dir, an unencodable path): found up
  front (:func:`preflight`: the run dir writable, room for one more checkpoint on resume) exit 2;
  found mid-run exit 1 with one line naming the file (the exception chain is walked: torch hides
  ENOSPC behind ``unexpected pos``), ``last.pt`` / ``prev.pt`` intact, ``summary.json`` ``failed``
  when the disk still takes it;
* exit 130 / 143: SIGINT / SIGTERM; the run stops at the end of the current update, saves a
  checkpoint and writes summary ``status: interrupted``; ``resume=<run_dir>`` continues it exactly.

``HYDRA_FULL_ERROR=1`` also prints the full traceback on the terminal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

import grpo_marl.config as config_mod  # registers the ${safe:} resolver before Hydra composes
import grpo_marl.distributed as dist
from grpo_marl import stopping
from grpo_marl.checkpoint import checkpoint_path, previous_path, read_checkpoint
from grpo_marl.errors import (
    CheckpointError,
    ConfigError,
    RemoteRankError,
    TrainingStopped,
    UserInputError,
    filesystem_message,
    one_line,
)

#: Exit codes of the contract (README, "When something goes wrong").
EXIT_FAILED, EXIT_INPUT = 1, 2
EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}
ERROR_LOG = "error.log"


# -- resume ----------------------------------------------------------------------------------------
def _resume_config(cfg: DictConfig, overrides: list[str], dry: bool = False) -> tuple[DictConfig, Path]:
    """The saved run's config with the few keys a resume may change; ``dry``: check only (nothing moved)."""
    run_dir = Path(str(cfg.resume)).expanduser()
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise ConfigError(
            f"resume={run_dir}: {cfg_path} not found; pass the directory of a run that wrote at least one checkpoint"
        )
    if not checkpoint_path(run_dir).exists() and not previous_path(run_dir).exists():
        raise ConfigError(
            f"resume={run_dir}: expected {checkpoint_path(run_dir)}; pass the directory of a run that wrote at "
            "least one checkpoint"
        )
    saved = OmegaConf.load(cfg_path)
    assert isinstance(saved, DictConfig), cfg_path  # a run's config.yaml is a mapping
    # Only a few keys may change on resume (e.g. extend training); the rest must match the run.
    allowed = {
        "total_steps", "device", "log.progress", "log.tensorboard", "threads",
        "autocast", "distributed.backend", "distributed.find_unused_parameters",
    }  # fmt: skip
    # A config-group switch (algo=ppo) would replace a whole section: refused like any other key.
    for group, option in config_mod.group_choices(overrides).items():
        was = str(OmegaConf.select(saved, f"{group}.name", default=None) or "default")
        if option != was:
            raise ConfigError(
                f"{group}={option} cannot change when resuming: {run_dir} was trained with {group}={was}; "
                "start a new run for another algorithm"
            )
    with open_dict(saved):
        for key in config_mod.user_override_keys(overrides):
            if key == "resume":
                continue
            if key not in allowed:
                was, now = OmegaConf.select(saved, key, default=None), OmegaConf.select(cfg, key, default=None)
                if _plain(was) == _plain(now):
                    continue  # the run's own value (the same command again, or its config file)
                raise ConfigError(
                    f"{key} cannot change when resuming: the run has {key}={_plain(was)!r}, this command "
                    f"gives {_plain(now)!r} (keys that may change: {', '.join(sorted(allowed))})"
                )
            OmegaConf.update(saved, key, OmegaConf.select(cfg, key), merge=False)
        saved.resume = str(run_dir)
    config_mod.validate(saved)
    _pick_checkpoint(saved, run_dir, dry=dry)
    return saved, run_dir


def _plain(value: Any) -> Any:
    """A config node as plain Python (lists and dicts compared by value)."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _pick_checkpoint(cfg: DictConfig, run_dir: Path, dry: bool = False) -> None:
    """Make ``last.pt`` a usable checkpoint of this run before the trainer loads it.

    A truncated, corrupt or foreign ``last.pt`` is reported by name and moved aside (``last.pt.bad``,
    nothing is deleted); ``prev.pt`` then takes its place. Neither usable: :class:`CheckpointError`.
    """
    last = checkpoint_path(run_dir)
    problems: list[str] = []
    chosen, state = None, None
    for path in (last, previous_path(run_dir)):
        if not path.exists():
            continue
        try:
            state = read_checkpoint(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        why = _foreign(state.get("config"), cfg)
        if why is not None:
            problems.append(f"{path} {why}")
            continue
        chosen = path
        break
    if chosen is None or state is None:
        raise CheckpointError(
            f"resume={run_dir}: no usable checkpoint in {last.parent}:\n  - "
            + "\n  - ".join(problems)
            + "\nstart a new run instead (another hydra.run.dir)"
        )
    if chosen != last and not dry:
        if last.exists():
            os.replace(last, last.with_name(last.name + ".bad"))
        tmp = last.with_name(".last.pt.restore.tmp")
        shutil.copyfile(chosen, tmp)
        os.replace(tmp, last)
        c = state["counters"]
        print(
            f"warning: {'; '.join(problems)}. Resuming from {chosen} instead (update {c['updates']}, "
            f"{c['env_steps']} env steps); the bad file is kept as {last.name}.bad",
            file=sys.stderr,
            flush=True,
        )


def _foreign(saved: Any, cfg: DictConfig) -> str | None:
    """Why a checkpoint's embedded config is not this run's, or None when it is."""
    if not isinstance(saved, dict):
        return None  # older checkpoints carry no config: nothing to compare
    algo: dict[str, Any] = saved["algo"] if isinstance(saved.get("algo"), dict) else {}
    theirs = (saved.get("env"), algo.get("name"), saved.get("seed"))
    ours = (str(cfg.env), str(cfg.algo.name), int(cfg.seed))
    if theirs != ours:
        return (
            f"belongs to another run (env={theirs[0]}, algo={theirs[1]}, seed={theirs[2]}; "
            f"this run: env={ours[0]}, algo={ours[1]}, seed={ours[2]})"
        )
    return None


# -- signals ---------------------------------------------------------------------------------------
class _StopOnSignal:
    """SIGINT/SIGTERM stop the run at the next safe point of its phase (:mod:`grpo_marl.stopping`);
    during setup at once; a second signal aborts now."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()

    def __enter__(self) -> None:
        self._pid = os.getpid()
        if threading.current_thread() is threading.main_thread():
            for sig in EXIT_SIGNAL:
                self._previous[sig] = signal.signal(sig, self._handle)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:
            return  # a forked env worker inherited this handler: the trainer process decides, not it
        if self.signum is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}")
        self.signum = signum
        phase = stopping.request(signum)
        if self.trainer is not None:
            self.trainer.stop_requested = signum
        if dist.env_rank() == 0:
            print(
                f"\n{signal.Signals(signum).name} received during {phase}: {self._plan(phase)} "
                "(send it again to abort at once)",
                file=sys.stderr,
                flush=True,
            )
        if phase == "setup":
            raise stopping.SetupInterrupted(signum)

    def _plan(self, phase: str) -> str:
        """What the run does next in ``phase`` (the line printed on the first signal)."""
        n = int(getattr(self.trainer, "updates", 0) or 0)
        kept = f"the checkpoint of update {n}" if n else "no checkpoint (no update finished yet)"
        return {
            "setup": "stopping now; nothing was trained, nothing to save",
            "collect": f"finishing update {n + 1}, then saving its checkpoint",
            "update": f"finishing update {n + 1}, then saving its checkpoint",
            "evaluate": f"abandoning the evaluation, keeping {kept}; resume= redoes the evaluation",
            "final_evaluate": f"abandoning the final evaluation, keeping {kept}; resume= redoes the final evaluation",
            "checkpoint": f"finishing the checkpoint of update {n} being written, then stopping",
            "save_model": "finishing writing the model, then stopping",
        }.get(phase, "stopping at the next safe point")


# -- one run ---------------------------------------------------------------------------------------
def run(cfg: DictConfig, overrides: list[str], run_dir: Path) -> dict:
    """Resolve, validate, claim the run dir and train. Returns the summary (``status`` may be
    ``interrupted``); raises :class:`UserInputError` before anything was built, anything else after."""
    from grpo_marl import rundir
    from grpo_marl.trainer import Trainer

    stopping.reset()
    cfg, run_dir, resume = prepare(cfg, overrides, run_dir)
    lock = rundir.claim(run_dir, resume=resume) if dist.env_rank() == 0 else None
    try:
        done = _already_done(cfg, run_dir) if resume else None
        if done is not None:
            if dist.env_rank() == 0:
                print(done, flush=True)
            return {**json.loads((run_dir / "summary.json").read_text()), "already_done": True}
        stopper = _StopOnSignal()
        trainer = None
        with stopper:
            try:
                trainer = Trainer(cfg, run_dir, resume=resume)
                stopper.trainer = trainer
                trainer.stop_requested = stopper.signum
                stopping.check()
                try:
                    summary = trainer.fit()
                finally:
                    stopping.enter("done")
                    trainer.close()
            except stopping.SetupInterrupted as exc:
                _stop_children()
                if trainer is not None:
                    trainer.close()
                return _setup_interrupted(cfg, run_dir, exc.signum)
        if trainer.is_main and summary.get("status") != "already_done":
            _print_summary(summary, run_dir)
        if summary.get("status") == "interrupted":
            summary["signal"] = int(stopper.signum or signal.SIGINT)
        return summary
    finally:
        if lock is not None:
            lock.release()


def _already_done(cfg: DictConfig, run_dir: Path) -> str | None:
    """The line saying a ``resume=`` run has nothing left to do (its summary says it completed, its
    checkpoint is at ``total_steps`` with the final evaluation logged), or None. Such a resume
    exits 0 and writes nothing (README, "When something goes wrong")."""
    try:
        status = json.loads((run_dir / "summary.json").read_text()).get("status")
        c = read_checkpoint(checkpoint_path(run_dir))["counters"]
    except (OSError, ValueError, AttributeError, KeyError, CheckpointError):
        return None
    steps, total = int(c["env_steps"]), int(cfg.total_steps)
    stopped = status == "threshold_reached" and bool(cfg.train.stop_on_threshold)
    if status not in ("completed", "threshold_reached") or c.get("pending_record") is not None:
        return None
    if c.get("final_logged_at") != steps or not (steps >= total or stopped):
        return None
    return (
        f"{run_dir} already {status.replace('_', ' ')} ({steps} env steps, total_steps={total}); nothing to do. "
        "To train further, resume with a larger total_steps=..."
    )


def _stop_children() -> None:
    """Kill this process's env workers (a signal during setup: one may hang in a constructor, and
    workers ignore the signals the trainer handles)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=5)


def _setup_interrupted(cfg: DictConfig, run_dir: Path, signum: int) -> dict[str, Any]:
    """``summary.json`` of a run stopped during setup (a resumed run's earlier figures are kept)."""
    ckpt = checkpoint_path(run_dir)
    summary = _merge_summary(cfg, _read_summary(run_dir))
    summary.update(status="interrupted", phase="setup", checkpoint=str(ckpt) if ckpt.exists() else None)
    if dist.env_rank() == 0:
        _write_summary(run_dir, summary)
    summary["signal"] = int(signum)
    return summary


def _read_summary(run_dir: Path) -> dict[str, Any]:
    """The run dir's ``summary.json``, or ``{}`` when there is none or it is unreadable."""
    path = run_dir / "summary.json"
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        return {}


def _merge_summary(cfg: DictConfig, previous: dict[str, Any]) -> dict[str, Any]:
    """The run's identity (env, algo, seed) under what ``previous`` already says."""
    return {
        "env": str(cfg.env),
        "algo": str(OmegaConf.select(cfg, "algo.name")),
        "seed": cfg.seed,
        **previous,
    }


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` atomically (a temp file renamed over it)."""
    path = run_dir / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=float) + "\n")
    tmp.replace(path)


def prepare(cfg: DictConfig, overrides: list[str], run_dir: Path, dry: bool = False) -> tuple[DictConfig, Path, bool]:
    """The run's final config, its directory and whether it resumes; raises :class:`UserInputError`
    for anything that must refuse the run (values, keys, env, extras, the ``resume=`` directory).
    ``dry``: check only, move no checkpoint file (the CLI's :func:`preflight`)."""
    from grpo_marl.tasks import check_extras

    resume = bool(cfg.resume)
    if resume:
        cfg, run_dir = _resume_config(cfg, overrides, dry=dry)
    else:
        cfg = config_mod.resolve_config(cfg, overrides)
    check_extras(cfg)
    return cfg, run_dir, resume


def _print_summary(summary: dict, run_dir: Path) -> None:
    parts = [f"env={summary['env']} algo={summary['algo']} seed={summary['seed']}"]
    if summary.get("status") == "interrupted":
        parts.append(f"interrupted at update {summary['updates']}")
    if "eval/return_mean" in summary:
        parts.append(
            f"final eval ({int(summary.get('eval/episodes', 0))} greedy episodes): "
            f"return {summary['eval/return_mean']:.2f} +- {summary['eval/return_std']:.2f}"
        )
    if "eval/accuracy" in summary:
        parts.append(f"accuracy {summary['eval/accuracy']:.3f}")
    evals = float(summary.get("eval_seconds") or 0.0)
    parts.append(
        f"env steps {summary['env_steps']}, wall {summary['wall_seconds']:.1f} s"
        + (f" ({evals:.1f} s of it evaluating)" if evals else "")
    )
    if summary.get("steps_to_threshold") is not None:
        train_ttt = summary.get("train_time_to_threshold_s")
        parts.append(
            f"threshold {summary['threshold']} reached at {summary['steps_to_threshold']} steps / "
            f"{summary['time_to_threshold_s']:.1f} s"
            + (f" ({train_ttt:.1f} s without evaluations)" if train_ttt is not None else "")
        )
    parts.append(f"run dir {run_dir}")
    print(" | ".join(parts), flush=True)


# -- how a run ends: messages, summary, error.log, exit code ---------------------------------------
def _debug() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


def _checkpoint_note(run_dir: Path) -> tuple[str | None, str]:
    """(path of the last good checkpoint or None, a sentence saying so)."""
    for path in (checkpoint_path(run_dir), previous_path(run_dir)):
        if path.exists():
            try:
                import torch

                counters = torch.load(path, map_location="cpu", weights_only=False)["counters"]
                where = f" (update {counters['updates']}, {counters['env_steps']} env steps)"
            except Exception:  # noqa: BLE001  (the note is best effort; the path is what matters)
                where = ""
            from grpo_marl.rundir import paste_override

            resume = paste_override("resume", run_dir)
            return str(path), f"The last good checkpoint is kept in {path}{where}; continue with {resume}"
    return None, "No checkpoint yet: the run failed before its first checkpoint."


def error_log_path(run_dir: Path, rank: int | None = None) -> Path:
    """Where this process (or torchrun rank ``rank``) writes its traceback: ``error.log``, or
    under torchrun every rank its own ``error.rank<N>.log`` (a rank's traceback is the one that
    explains its failure; rank 0's alone is usually only the collective's reaction to it)."""
    if dist.env_world_size() > 1:
        return run_dir / f"error.rank{dist.env_rank() if rank is None else rank}.log"
    return run_dir / ERROR_LOG


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during (each once)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _origin(exc: BaseException) -> tuple[int, str] | None:
    """``(rank, one-line error)`` of the rank whose failure ``exc`` relays, when it says."""
    for cur in _chain(exc):
        if isinstance(cur, RemoteRankError) and cur.origin_rank is not None:
            return cur.origin_rank, cur.origin_error
    return None


def _is_reaction(exc: BaseException) -> bool:
    """Whether a torchrun rank's error is its reaction to another rank's failure (that rank's
    message relayed, or the process group breaking because a peer exited) rather than its own."""
    return any(
        isinstance(cur, RemoteRankError) or any(s in f"{type(cur).__name__}: {cur}" for s in _PEER_GONE)
        for cur in _chain(exc)
    )


#: how gloo/NCCL/c10d report a peer that exited or closed its connection
_PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "DistBackendError",
    "DistNetworkError",
)


#: How long a rank that only reacted to another's failure waits for that rank's own record.
_RECORD_WAIT_S = 5.0


def _record_failure(run_dir: Path, cfg: DictConfig, exc: BaseException, status: str) -> dict[str, Any]:
    """Write the traceback (:func:`error_log_path`) and ``summary.json`` (``status``, message,
    checkpoint). Under torchrun the summary names the rank that failed first (``failed_rank``):
    a failing rank records its own error before it exits, and a rank whose error is only the
    reaction to it keeps that record instead of replacing it. A reaction that knows the failing
    rank (:class:`RemoteRankError`) and finds no record after a moment writes that rank's record
    on its behalf (a starved or slow rank may record late; its own record then replaces it, so
    the summary never blames the rank that only reacted)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = error_log_path(run_dir)
    with open(log, "a") as f:
        f.write("".join(traceback.format_exception(exc)))
    world, rank = dist.env_world_size(), dist.env_rank()
    if world > 1 and rank != 0 and _is_reaction(exc):
        return {}  # summary.json is the failing rank's and rank 0's to write; this rank's log is kept
    previous = _read_summary(run_dir)
    if world > 1 and _is_reaction(exc):
        # the failing rank writes its record before it exits; give it a moment to land
        deadline = time.monotonic() + _RECORD_WAIT_S
        while "failed_rank" not in previous and time.monotonic() < deadline:
            time.sleep(0.05)
            previous = _read_summary(run_dir)
    if previous.get("status") not in (None, "failed", status):
        previous = {}  # a previous run's summary (resume): this one replaces it
    ckpt, _ = _checkpoint_note(run_dir)
    summary = _merge_summary(cfg, previous)
    error = previous.get("error") or one_line(exc)
    fields: dict[str, Any] = {"error_log": previous.get("error_log") or str(log)}
    origin = _origin(exc)
    if world > 1 and "failed_rank" not in previous and origin is not None:
        error = f"rank {origin[0]}: {origin[1]}"  # on behalf of the failing rank, which has not recorded yet
        fields = {"failed_rank": origin[0], "error_log": str(error_log_path(run_dir, origin[0]))}
    elif world > 1 and ("failed_rank" not in previous or (not _is_reaction(exc) and previous["failed_rank"] == rank)):
        error = f"rank {rank}: {one_line(exc)}"
        fields = {"failed_rank": rank, "error_log": str(log)}
    summary.update(status=status, error=error, checkpoint=ckpt, **fields)
    _write_summary(run_dir, summary)
    return summary


def _record_failure_safely(run_dir: Path, cfg: DictConfig, exc: BaseException, status: str) -> bool:
    """:func:`_record_failure`, or False when the run dir cannot take it (a full disk, read-only):
    the one-line message on the terminal is then all there is; a partial ``summary.json.tmp`` is removed."""
    try:
        _record_failure(run_dir, cfg, exc, status)
        return True
    except OSError:
        try:
            (run_dir / "summary.json.tmp").unlink(missing_ok=True)
        except OSError:
            pass
        return False


def _fail(message: str, code: int) -> None:
    print(message, file=sys.stderr, flush=True)
    sys.exit(code)


def _run_cli(cfg: DictConfig, overrides: list[str], run_dir: Path) -> None:
    """:func:`run` with the exit-code contract applied (see the module docstring)."""
    from grpo_marl.rundir import paste_override
    from grpo_marl.trainer import STOP_ERRORS

    where = f"rank {dist.env_rank()}: " if dist.env_world_size() > 1 else ""
    actual_dir = Path(str(cfg.resume)).expanduser() if cfg.resume else run_dir
    try:
        summary = run(cfg, overrides, run_dir)
    except UserInputError as exc:
        if _debug():
            traceback.print_exc()
        if dist.env_rank() == 0 and not _PREEXISTING_DIR and not cfg.resume:
            from grpo_marl.rundir import discard_unused

            discard_unused(run_dir)  # what Hydra created for a run that never started
        _fail(f"error: {where}{exc}", EXIT_INPUT)
    except KeyboardInterrupt as exc:  # a second signal: abort without waiting for the update to end
        signum = signal.SIGTERM if "SIGTERM" in str(exc) else signal.SIGINT
        if dist.env_rank() == 0:
            _record_failure_safely(actual_dir, cfg, exc, "interrupted")
        _, note = _checkpoint_note(actual_dir)
        _fail(f"aborted by {signum.name} in the middle of an update. {note}", EXIT_SIGNAL[signum])
    except Exception as exc:  # noqa: BLE001  (every failure ends per the contract)
        fs_message = filesystem_message(exc, actual_dir)  # a full disk, a read-only or unwritable dir
        log = error_log_path(actual_dir)
        traceback_note = f"Full traceback: {log} (or rerun with HYDRA_FULL_ERROR=1)"
        recorded: bool | None = None
        if dist.env_world_size() > 1 and not _is_reaction(exc):
            # the rank that failed first records it before anything else (torchrun may stop the
            # other ranks as soon as this one exits, and their own errors are only reactions)
            recorded = _record_failure_safely(actual_dir, cfg, exc, "failed")
        if isinstance(exc, STOP_ERRORS + (TrainingStopped,)):
            dist.barrier_on_failure(dist.init())
            message = str(exc)
        else:
            message = fs_message or f"unexpected {one_line(exc)}"
        if recorded is None and (dist.env_rank() == 0 or dist.env_world_size() > 1):
            recorded = _record_failure_safely(actual_dir, cfg, exc, "failed")
        if recorded is False:
            traceback_note = f"{log.name} and summary.json could not be written; rerun with HYDRA_FULL_ERROR=1"
        origin = _read_summary(actual_dir) if dist.env_world_size() > 1 and _is_reaction(exc) else {}
        if origin.get("failed_rank") not in (None, dist.env_rank()):
            # name the rank that failed, not this one's view of the broken process group
            error = str(origin.get("error", "")).split(": ", 1)[-1]
            message = f"stopped because rank {origin['failed_rank']} failed: {error} (see {origin.get('error_log')})"
        if _debug():
            traceback.print_exc()
        _, note = _checkpoint_note(actual_dir)
        _fail(f"error: {where}{message}\n{note}\n{traceback_note}", EXIT_FAILED)
    else:
        if summary.get("status") == "interrupted":
            signum = signal.Signals(summary.get("signal", signal.SIGINT))
            if dist.env_rank() == 0 and summary.get("phase") == "setup":
                kept = summary.get("checkpoint")
                print(
                    f"interrupted by {signum.name} during setup: nothing was trained"
                    + (
                        f"; the checkpoint is unchanged, continue with: python -m grpo_marl.train "
                        f"{paste_override('resume', actual_dir)}"
                        if kept
                        else "; run the command again to start over"
                    ),
                    file=sys.stderr,
                    flush=True,
                )
            elif dist.env_rank() == 0:
                print(
                    f"interrupted by {signum.name}: checkpoint saved at update {summary['updates']} "
                    f"({summary['env_steps']} env steps) in {checkpoint_path(actual_dir)}; "
                    f"continue with: python -m grpo_marl.train {paste_override('resume', actual_dir)}",
                    file=sys.stderr,
                    flush=True,
                )
            sys.exit(EXIT_SIGNAL[signum])


_STARTED = False  # set once Hydra composed the config and called :func:`hydra_main`
#: the overrides the user's own config file stands for (``--config-dir D --config-name exp``)
_FILE_ARGS: list[str] = []


def _user_file_args(args: list[str]) -> list[str]:
    """The overrides of the user's config file named in ``args`` (see :func:`overrides.file_overrides`),
    or exit 2 naming the file and what is wrong with it."""
    from grpo_marl.overrides import file_overrides, user_config_file

    try:
        path = user_config_file(args, _CONF_DIR)
        if path is None:
            return []
        file_args = file_overrides(path)
    except UserInputError as exc:
        _fail(f"error: {exc}", EXIT_INPUT)
    problems = config_mod.check_command_line(file_args)
    if problems:
        _fail(f"error: invalid config file {path}:\n  - " + "\n  - ".join(problems), EXIT_INPUT)
    return file_args


_CONF_DIR = Path(__file__).resolve().parent / "conf"
_PREEXISTING_DIR = False  # hydra.run.dir named a directory that existed before this command


def _is_hydra_arg(arg: str) -> bool:
    key = arg.lstrip("+~").split("=", 1)[0]
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def _hydra_value(args: list[str], key: str) -> str | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for arg in reversed(args):
        if arg.lstrip("+").startswith(f"{key}="):
            try:
                return str(OverridesParser.create().parse_override(arg).value())
            except Exception:  # noqa: BLE001  (Hydra reports an unparsable override itself)
                return None
    return None


def _quote(value: str) -> str:
    """``value`` as one quoted Hydra override value (any characters, spaces and non-ASCII included)."""
    from grpo_marl.rundir import hydra_quote

    return hydra_quote(value, force=True)


def preflight(args: list[str]) -> list[str]:
    """Refuse a wrong command before Hydra creates a run directory; return extra Hydra overrides.

    Hydra creates ``runs/<env>/<algo>_seed<seed>_<time>/`` with ``.hydra/`` and ``train.log`` before
    the task function runs, so checking there would leave a directory behind every refused run
    (and overwrite the ``.hydra/`` of a run that ``hydra.run.dir`` points at). This composes the
    same config with Hydra's compose API, runs every check :func:`run` makes before training
    (:func:`prepare`, the run directory's lock and contents) and exits 2 on the first problem.
    A ``resume=`` run gets ``hydra.run.dir=<that run>`` and no new ``.hydra/``, so resuming makes
    no directory. Sweeps (``-m``) and Hydra's own flags skip this: their jobs are checked as before.
    """
    global _PREEXISTING_DIR
    explicit = _hydra_value(args, "hydra.run.dir")
    _PREEXISTING_DIR = explicit is not None and Path(explicit).expanduser().exists()
    from grpo_marl.overrides import config_flags, user_config_file

    flags, rest = config_flags(args)
    if any(a.startswith("-") for a in rest):
        return []
    from grpo_marl import rundir

    overrides = [a for a in rest if not _is_hydra_arg(a)]
    where = f"rank {dist.env_rank()}: " if dist.env_world_size() > 1 else ""
    try:
        user_file = user_config_file(args, _CONF_DIR) if flags else None
        try:  # a user's file: its dir first, grpo_marl's conf after (as Hydra's CLI composes it)
            cfg = config_mod.compose(
                overrides,
                config_name=user_file.stem if user_file is not None else "config",
                config_dir=user_file.parent if user_file is not None else None,
            )
        except UserInputError:
            raise
        except Exception:  # noqa: BLE001  (a command Hydra cannot compose: Hydra reports it as before)
            return []
        cfg, run_dir, resume = prepare(cfg, _FILE_ARGS + overrides, Path(explicit or "."), dry=True)
        if resume or explicit is not None:
            rundir.check_free(run_dir, resume=resume)
        # Writable, with room for one more checkpoint when its size is known (a resume); a fresh
        # run without hydra.run.dir is created under ./runs. Mid-run faults: exit 1 (see _run_cli).
        last = checkpoint_path(run_dir)
        need = last.stat().st_size if resume and last.exists() else 0
        advice = rundir.COPY_IT.format(verb="resume") if resume else rundir.ELSEWHERE
        rundir.check_writable(run_dir if resume or explicit is not None else Path("runs"), need, advice)
    except UserInputError as exc:
        if _debug():
            traceback.print_exc()
        _fail(f"error: {where}{exc}", EXIT_INPUT)
    if not resume:
        return []
    extra = [] if explicit is not None else [f"hydra.run.dir={_quote(str(run_dir))}"]
    if _hydra_value(args, "hydra.output_subdir") is None:
        extra.append("hydra.output_subdir=null")  # the run's .hydra/ is from its start: keep it
    return extra


# An absolute path: the config is found the same way from ``python -m``, the console script and tests.
@hydra.main(version_base="1.3", config_path=str(_CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    global _STARTED
    _STARTED = True
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    if dist.env_world_size() > 1:
        # torchrun: every rank trains in rank 0's run dir (Hydra's default dir has a timestamp,
        # which differs per process; ranks > 0 were pointed at a throwaway dir, see below).
        ctx = dist.init(str(cfg.distributed.backend))
        run_dir = Path(dist.broadcast_object(str(run_dir), ctx))
    try:
        _run_cli(cfg, _FILE_ARGS + list(hc.overrides.task), run_dir)
    finally:
        dist.shutdown()


def main(argv: list[str] | None = None) -> None:
    """The CLI: command-line checks Hydra would report as a stack of errors, then Hydra + :func:`run`.

    A command line Hydra cannot compose (unknown key, unknown config option) exits 2 as well.
    """
    global _STARTED
    _STARTED = False
    saved_argv = list(sys.argv)
    if argv is not None:
        sys.argv[1:] = list(argv)
    args = sys.argv[1:]
    if args == ["--help-config"]:  # every key, its default, range and help (docs/CONFIG.md)
        from grpo_marl.settings import reference_markdown

        sys.argv[:] = saved_argv
        print(reference_markdown(), end="")
        return
    scratch = None
    early = _StopOnSignal()  # a signal before the run claims its directory: exit at once
    stopping.reset()
    try:
        early.__enter__()
        from grpo_marl.rundir import quote_path_overrides

        args = quote_path_overrides(args)  # resume=/tmp/r é: Hydra refuses unquoted non-ASCII values
        problems = config_mod.check_command_line(args)
        if problems:
            _fail("error: invalid command line:\n  - " + "\n  - ".join(problems), EXIT_INPUT)
        _FILE_ARGS[:] = _user_file_args(args)
        args = args + preflight(args)
        extra, scratch = rank_overrides(args, dist.env_rank(), dist.env_world_size())
        sys.argv[1:] = args + extra
        hydra_main()
    except stopping.SetupInterrupted as exc:  # before the run claimed its directory: nothing written
        name = signal.Signals(exc.signum).name
        _fail(f"interrupted by {name} during setup: nothing was trained", EXIT_SIGNAL[signal.Signals(exc.signum)])
    except KeyboardInterrupt:  # before the trainer installed its handlers: nothing to save yet
        _fail("interrupted before training started; nothing was trained", EXIT_SIGNAL[signal.SIGINT])
    except SystemExit as exc:
        if not _STARTED and exc.code == 1:
            sys.exit(EXIT_INPUT)  # Hydra refused the command line (its message is printed above)
        raise
    finally:
        early.__exit__(None, None, None)
        sys.argv[:] = saved_argv
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def rank_overrides(argv: list[str], rank: int, world: int) -> tuple[list[str], str | None]:
    """Extra Hydra overrides for torchrun rank ``rank`` > 0, and the throwaway dir they use.

    Hydra creates its run dir (and ``.hydra/``, ``train.log``) before our code runs; ranks > 0
    must write nothing, so they get no output subdir, no log files and, unless the user fixed
    ``hydra.run.dir``, a temporary run dir (removed at exit). :func:`hydra_main` then replaces it
    with rank 0's real run dir, broadcast over the process group.
    """
    if world <= 1 or rank == 0:
        return [], None
    extra = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    if not any(a.startswith(("hydra.output_subdir=", "+hydra.output_subdir=")) for a in argv):
        extra.insert(0, "hydra.output_subdir=null")
    scratch = tempfile.mkdtemp(prefix=f"grpo_marl_rank{rank}_")
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        if not any(a.startswith((f"{key}=", f"+{key}=")) for a in argv):
            extra.append(f"{key}={scratch}")
    return extra, scratch


if __name__ == "__main__":
    main()
