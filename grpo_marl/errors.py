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
    """Another torchrun rank failed (its message is quoted); this rank stops with it."""


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
