"""Every user-facing error type, in one place.

The CLI maps them to exit codes (see README, "When something goes wrong"): a
:class:`UserInputError` means the configuration or inputs are wrong and nothing was built (exit 2);
a :class:`TrainingStopped` ends a run that had started (exit 1, ``summary.json`` says ``failed``,
the last checkpoint is kept). Messages name the key / env / file involved and what to change.
"""

from __future__ import annotations


class GrpoMarlError(Exception):
    """Base of every error this package raises on purpose."""


# -- wrong input: nothing was built (exit 2) ---------------------------------------------------
class UserInputError(GrpoMarlError, ValueError):
    """The configuration, a file or an argument is wrong; the message says what to change."""


class ConfigError(UserInputError):
    """Invalid configuration (one line per problem, each naming the key)."""


class UnknownEnvError(UserInputError, KeyError):
    """An env name that is not registered, not ``gym:``/``pz:`` and not importable."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class UnsupportedSpaceError(UserInputError):
    """An observation or action space the policy cannot handle."""


class MissingExtraError(UserInputError, ImportError):
    """An optional dependency is missing; the message names the extra that installs it."""


# -- a run that started and failed (exit 1) ----------------------------------------------------
class TrainingStopped(GrpoMarlError, RuntimeError):
    """Training stopped cleanly: summary says ``failed`` and the last checkpoint is kept."""


class NonFiniteError(TrainingStopped):
    """An observation, reward or loss was NaN/inf."""


class EnvError(TrainingStopped):
    """An env raised (or returned something malformed) during reset/step, in this process or in a
    worker process. The message names the env, the vector index and the episode's reset seed, so
    the failure can be replayed alone."""


# Kept as an alias: the name older code and tests know for env worker failures.
EnvWorkerError = EnvError


class RemoteRankError(TrainingStopped):
    """Another torchrun rank failed (its message is quoted); this rank stops with it.

    ``origin_rank`` / ``origin_error``: the rank that failed and its one-line error, so this rank
    can record the failure on its behalf when that rank is too slow to record it itself."""

    def __init__(self, message: str, origin_rank: int | None = None, origin_error: str = "") -> None:
        super().__init__(message)
        self.origin_rank = origin_rank
        self.origin_error = origin_error


# -- appended by the reliability work (issue 12) -----------------------------------------------
class RunDirError(UserInputError):
    """The run directory is in use by another run, or already holds a run (pass ``resume=``)."""


class CheckpointError(UserInputError):
    """No usable checkpoint: the file is missing, truncated, not a checkpoint, or another run's."""


# -- text envs -----------------------------------------------------------------------------------
class ModelPathError(UserInputError):
    """``model.path`` is missing, unreadable, or not a causal LM (one line naming the path)."""


class DatasetError(UserInputError):
    """A prompt file (JSONL) is missing or malformed; the message names the file and the line."""


class RewardFunctionError(TrainingStopped):
    """A reward function raised or returned a non-finite or wrongly sized result; the message
    names the function and quotes the offending completion."""


# -- filesystem faults (issue 27) -----------------------------------------------------------------
class FilesystemError(GrpoMarlError, OSError):
    """A file could not be written: the disk is full, the filesystem read-only, the directory not
    writable, or the path not encodable. The message names the path and what to do (mid-run: exit
    1 with the last good checkpoint named; found up front: :class:`RunDirNotWritableError`, exit 2)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RunDirNotWritableError(UserInputError):
    """The run directory (or where it would be created) is read-only, not writable or full."""


def _fs_errnos() -> dict[int, str]:
    import errno

    found = {
        errno.ENOSPC: "no space left on device",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
    }
    if hasattr(errno, "EDQUOT"):
        found[errno.EDQUOT] = "disk quota exceeded"
    return found


def filesystem_fault(exc: BaseException | None) -> BaseException | None:
    """The first filesystem fault in ``exc``'s chain (``__cause__`` / ``__context__``): an
    :class:`OSError` whose errno is ENOSPC, EDQUOT, EROFS, EACCES or EPERM, a
    :class:`FilesystemError`, or a :class:`UnicodeEncodeError` (a path the filesystem encoding
    cannot hold). torch's ``save`` raises ``RuntimeError: [enforce fail ...] unexpected pos`` with
    the ENOSPC only chained, which is why the chain is walked."""
    seen: set[int] = set()
    codes = _fs_errnos()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, FilesystemError) or isinstance(exc, UnicodeEncodeError):
            return exc
        if isinstance(exc, OSError) and exc.errno in codes:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def filesystem_message(exc: BaseException, path: object = None) -> str | None:
    """One line for a filesystem fault in ``exc``'s chain naming the path and what to do, or None.

    ``path``: the file being written when the fault carries no file name itself (a failed
    ``write()`` on an open file names none)."""
    import errno

    fault = filesystem_fault(exc)
    if fault is None:
        return None
    if isinstance(fault, FilesystemError):
        return str(fault)
    if isinstance(fault, UnicodeEncodeError):
        import sys

        return (
            f"a path cannot be encoded in the filesystem encoding ({sys.getfilesystemencoding()}): {fault}; "
            "run with a UTF-8 locale (e.g. LANG=C.UTF-8) or pass hydra.run.dir=<an ASCII path>"
        )
    assert isinstance(fault, OSError) and fault.errno is not None
    where = fault.filename if fault.filename is not None else path
    what = _fs_errnos()[fault.errno]
    target = f" writing {where}" if where is not None else ""
    if fault.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        advice = "free space or pass hydra.run.dir=<a directory on another disk>"
    elif fault.errno == errno.EROFS:
        advice = "pass hydra.run.dir=<a writable directory>"
    else:
        advice = "make the directory writable or pass hydra.run.dir=<a writable directory>"
    return f"{what}{target}: {advice}"


def one_line(exc: BaseException) -> str:
    """An error as one line: our own errors by their message (it names the key, env or file),
    anything else prefixed with its type."""
    text = str(exc).strip()
    if isinstance(exc, (TrainingStopped, UserInputError, FilesystemError)):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
