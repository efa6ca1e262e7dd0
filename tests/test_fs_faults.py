"""Filesystem faults as user errors, driven as real processes (issue 27, item 2).

* a full disk mid-run (a small tmpfs, filled after the second checkpoint): exit 1, one line naming
  the checkpoint file being written and what to do, the last good checkpoint named, ``last.pt``
  and ``prev.pt`` intact and no partial temporary file; resuming on the still-full disk is refused
  up front (exit 2), and once space is freed the printed ``resume=`` works;
* a read-only run directory (a tmpfs mounted read-only): a new run, a resume and an evaluation are
  refused up front with one line (exit 2), nothing written;
* a run directory with non-ASCII characters and spaces: train, Ctrl-C, the printed resume command
  pasted into ``bash -c`` resumes, ``evaluate run=<dir>`` evaluates; an unquoted ``resume=<dir>``
  reaches the run (Hydra's lexer alone would refuse it).

Mounting needs root with CAP_SYS_ADMIN; where it is not permitted those tests skip with the reason
(root ignores chmod, so a read-only mount is the only honest read-only directory here).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser

from grpo_marl.checkpoint import atomic_save, checkpoint_path, previous_path
from grpo_marl.errors import FilesystemError, filesystem_fault, filesystem_message
from grpo_marl.rundir import hydra_quote, paste_override, quote_path_overrides
from tests.conftest import ROOT, _subprocess_env
from tests.test_failures import FAST, TIMEOUT, cli, counters, start, summary, wait_for

README = (ROOT / "README.md").read_text()


# -- quoting: what the framework prints runs when pasted -------------------------------------------
PATHS = [
    "/tmp/run",
    "/tmp/r é",
    "/tmp/a b",
    "/tmp/x'y",
    '/tmp/x"y',
    "/tmp/a\\b é",
    "/tmp/é\\",
    "/tmp/a,b",
    "/tmp/$HOME",
]


@pytest.mark.parametrize("path", PATHS)
def test_printed_override_survives_the_shell_and_hydra(path: str) -> None:
    word = paste_override("resume", path)
    (arg,) = shlex.split(word)  # what a POSIX shell passes on
    assert OverridesParser.create().parse_override(arg).value() == path  # what Hydra reads
    if path == "/tmp/run":
        assert word == "resume=/tmp/run"  # plain ASCII paths print as they are
    assert OverridesParser.create().parse_override("k=" + hydra_quote(path, force=True)).value() == path


def test_unquoted_path_values_are_quoted_for_hydra() -> None:
    args = quote_path_overrides(["resume=/tmp/r é", "hydra.run.dir=/tmp/ü", "env=cartpole", "resume='/tmp/q é'"])
    assert args == ['resume="/tmp/r é"', 'hydra.run.dir="/tmp/ü"', "env=cartpole", "resume='/tmp/q é'"]


# -- the exception chain and the checkpoint write, in process -----------------------------------------
def test_enospc_is_found_behind_torchs_runtime_error() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    except RuntimeError as exc:
        assert isinstance(filesystem_fault(exc), OSError)
        assert filesystem_message(exc, "/r/checkpoints/last.pt") == (
            "no space left on device writing /r/checkpoints/last.pt: free space or pass "
            "hydra.run.dir=<a directory on another disk>"
        )
    assert filesystem_fault(RuntimeError("unrelated")) is None


def test_failed_checkpoint_write_keeps_last_and_prev(tmp_path: Path, monkeypatch) -> None:
    last = checkpoint_path(tmp_path)
    atomic_save({"n": 1}, last, keep_previous=True)
    atomic_save({"n": 2}, last, keep_previous=True)

    def full_disk(obj, f, *a, **k):
        f.write(b"partial bytes")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") from None  # noqa: B904

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(FilesystemError, match=re.escape(f"no space left on device writing {last}: free space")):
        atomic_save({"n": 3}, last, keep_previous=True)
    monkeypatch.undo()
    assert torch.load(last)["n"] == 2 and torch.load(previous_path(tmp_path))["n"] == 1
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.pt", "prev.pt"]  # no partial temp file


def test_permission_denied_is_named_with_what_to_do(tmp_path: Path, monkeypatch) -> None:
    """EACCES (root, who runs this suite here, ignores chmod, so ``os.access`` is stood in for)."""
    from grpo_marl import rundir
    from grpo_marl.errors import RunDirNotWritableError

    exc = OSError(errno.EACCES, "Permission denied", str(tmp_path / "metrics.jsonl"))
    assert filesystem_message(exc) == (
        f"permission denied writing {tmp_path / 'metrics.jsonl'}: make the directory writable or pass "
        "hydra.run.dir=<a writable directory>"
    )
    monkeypatch.setattr(rundir.os, "access", lambda *a: False)
    with pytest.raises(RunDirNotWritableError) as info:
        rundir.check_writable(tmp_path / "new" / "run")
    assert str(info.value) == (
        f"run directory {tmp_path / 'new' / 'run'}: {tmp_path} (to create {tmp_path / 'new' / 'run'} in) is not "
        "writable (permission denied); pass hydra.run.dir=<a writable directory>"
    )


# -- real filesystems: a small tmpfs ----------------------------------------------------------------
def _mount(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); not root here")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {proc.stderr.strip()}")


@pytest.fixture
def mounts(tmp_path: Path):
    made: list[Path] = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        _mount(where, options)
        made.append(where)
        return where

    yield mount
    for where in reversed(made):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(where: Path, leave: int) -> Path:
    """Fill the filesystem at ``where`` up to ``leave`` free bytes (metrics and summary still fit,
    a checkpoint does not)."""
    filler = where / f"filler-{uuid.uuid4().hex}"
    st = os.statvfs(where)
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, max(0, st.f_bavail * st.f_frsize - leave))
    finally:
        os.close(fd)
    return filler


def _readme_sample(name: str) -> list[str]:
    """The lines of README's sample marked ``<!-- fs-faults-test: NAME -->`` (checked verbatim here)."""
    lines = README.splitlines()
    i = lines.index(f"<!-- fs-faults-test: {name} -->")
    end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
    return lines[i + 2 : end]


def test_full_disk_under_metrics_names_metrics_jsonl(mounts) -> None:
    from grpo_marl.logging import RunLogger

    disk = mounts("metrics", "size=4k")
    logger = RunLogger(disk, 10, tensorboard=False, progress=False)
    with pytest.raises(FilesystemError) as info:
        for step in range(1000):
            logger.log(step, {"train/" + "x" * 60: 1.0})
    assert str(info.value) == (
        f"no space left on device writing {disk / 'metrics.jsonl'}: free space or pass "
        "hydra.run.dir=<a directory on another disk>"
    )


def test_full_disk_mid_run_names_the_file_and_keeps_the_checkpoints(mounts) -> None:
    disk = mounts("disk", "size=8m")
    run_dir = disk / "run"
    proc = start(*FAST, "total_steps=20000000", "checkpoint.every=1", run_dir=run_dir)
    wait_for(previous_path(run_dir), proc)  # two checkpoints written
    filler = _fill(disk, leave=40 * 1024)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1, err
    last, prev = checkpoint_path(run_dir), previous_path(run_dir)
    c = counters(last)
    assert counters(prev)["updates"] == c["updates"] - 1  # both intact, neither the one being written
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.pt", "prev.pt"]  # no partial temp file
    lines = err.strip().splitlines()
    assert lines == [
        f"error: no space left on device writing {last}: free space or pass hydra.run.dir=<a directory on another disk>",
        f"The last good checkpoint is kept in {last} (update {c['updates']}, {c['env_steps']} env steps); "
        f"continue with resume={run_dir}",
        f"Full traceback: {run_dir / 'error.log'} (or rerun with HYDRA_FULL_ERROR=1)",
    ]
    s = summary(run_dir)
    assert s["status"] == "failed" and s["error"] == lines[0][len("error: ") :] and s["checkpoint"] == str(last)
    # README's sample is this output, with its run dir and counters
    sample = [line.replace("/mnt/small/run", str(run_dir)) for line in _readme_sample("full-disk")]
    sample = [re.sub(r"\(update \d+, \d+ env steps\)", f"(update {c['updates']}, {c['env_steps']} env steps)", x)
              for x in sample]  # fmt: skip
    assert sample == [f"$ python -m grpo_marl.train env=cartpole checkpoint.every=1 hydra.run.dir={run_dir}", *lines]

    # still full: resuming is refused before anything is written
    again = cli(f"resume={run_dir}", "log.progress=false", run_dir=run_dir)
    assert again.returncode == 2, again.stderr
    assert again.stderr.startswith(f"error: run directory {run_dir}: no space left on device for a checkpoint (")
    assert len(again.stderr.strip().splitlines()) == 1 and counters(last) == c

    # space freed: the resume the message printed runs as pasted
    filler.unlink()
    token = re.search(r"continue with (\S+)$", lines[1]).group(1)
    done = subprocess.run(
        ["bash", "-c", f"{shlex.quote(sys.executable)} -m grpo_marl.train {token} total_steps={c['env_steps'] + 1}"
                       " log.progress=false"],  # fmt: skip
        cwd=ROOT, env=_subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert summary(run_dir)["status"] == "completed"


def test_read_only_run_dir_is_refused_up_front(mounts) -> None:
    ro = mounts("ro", "size=1m,ro")
    proc = cli(*FAST, "total_steps=1", run_dir=ro / "run")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: run directory {ro / 'run'}: {ro} (to create {ro / 'run'} in) is on a read-only file system; "
        "pass hydra.run.dir=<a writable directory>"
    ]
    assert os.listdir(ro) == []
    sample = [line.replace("/mnt/ro", str(ro)) for line in _readme_sample("read-only")]
    assert sample == [
        f"$ python -m grpo_marl.train env=cartpole hydra.run.dir={ro / 'run'}",
        *proc.stderr.strip().splitlines(),
    ]


def test_read_only_finished_run_refuses_resume_and_evaluate(mounts) -> None:
    disk = mounts("done", "size=8m")
    run_dir = disk / "run"
    first = cli(*FAST, "total_steps=1", "checkpoint.every=1", run_dir=run_dir)
    assert first.returncode == 0, first.stderr
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    for module, arg, verb in (("grpo_marl.train", "resume", "resume"), ("grpo_marl.evaluate", "run", "evaluate")):
        proc = subprocess.run(
            [sys.executable, "-m", module, f"{arg}={run_dir}", *(["total_steps=5000"] if verb == "resume" else [])],
            cwd=ROOT, env=_subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"error: run directory {run_dir}: {run_dir} is on a read-only file system; make it writable, or copy "
            f"the run directory somewhere writable and {verb} that copy"
        ]


# -- non-ASCII and spaces -----------------------------------------------------------------------------
def test_non_ascii_run_dir_trains_resumes_as_printed_and_evaluates(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs é" / "ça marche"
    proc = start(*FAST, "total_steps=20000000", "checkpoint.every=1", run_dir=run_dir)
    wait_for(checkpoint_path(run_dir), proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err
    printed = re.search(r"continue with: (.+)$", err.strip(), re.M).group(1)
    assert printed == f"python -m grpo_marl.train {shlex.quote(f'resume={hydra_quote(str(run_dir))}')}"
    stopped = summary(run_dir)["env_steps"]
    shell = ["bash", "-c"]
    kw = dict(cwd=ROOT, env=_subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT)
    resumed = subprocess.run([*shell, printed.replace("python", shlex.quote(sys.executable), 1)
                              + f" total_steps={stopped + 1} log.progress=false"], **kw)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert summary(run_dir)["status"] == "completed" and summary(run_dir)["env_steps"] >= stopped
    evaluated = subprocess.run(
        [*shell, f"{shlex.quote(sys.executable)} -m grpo_marl.evaluate {shlex.quote(f'run={run_dir}')} episodes=2"],
        **kw,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads((run_dir / "eval.json").read_text())["run"] == str(run_dir)


def test_unquoted_non_ascii_resume_reaches_the_run(tmp_path: Path) -> None:
    missing = tmp_path / "nicht da é"
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_marl.train", f"resume={missing}"],
        cwd=ROOT, env=_subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: resume={missing}: {missing / 'config.yaml'} not found; pass the directory of a run that wrote "
        "at least one checkpoint"
    )
