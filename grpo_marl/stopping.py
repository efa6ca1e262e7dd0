"""How a run stops on SIGINT/SIGTERM: the phase it is in, and the safe points where work is cut.

The CLI's signal handler (``grpo_marl.train._StopOnSignal``) records the signal here. What happens
next depends on the phase (README, "When something goes wrong"):

* ``setup`` (env construction, worker start, model loading): the handler raises
  :class:`SetupInterrupted` at once; nothing was trained, nothing is saved;
* ``collect`` / ``update``: the update finishes and its checkpoint is written;
* ``evaluate`` / ``final_evaluate``: the evaluation is abandoned at its next step (:func:`check`
  raises :class:`Abandoned`, which the trainer catches); the checkpoint of the last update is
  written and ``resume=`` redoes the evaluation;
* ``checkpoint`` / ``save_model``: the write finishes (checkpoints are atomic), then the run stops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

PHASES = ("setup", "collect", "update", "evaluate", "final_evaluate", "checkpoint", "save_model")
#: Phases whose work is abandoned at the next :func:`check` rather than finished.
ABANDONED = frozenset({"evaluate", "final_evaluate"})


class SetupInterrupted(BaseException):
    """A signal during setup: the run exits at once (nothing to save)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Abandoned(BaseException):
    """Raised by :func:`check` in an evaluation once a stop was requested (a BaseException, so no
    ``except Exception`` on the way swallows it); the trainer catches it."""


_signum: int | None = None
_phase = "setup"
#: The phase the first signal arrived in (what ``summary.json`` reports).
_stopped_in: str | None = None


def reset() -> None:
    """A new run in this process: no signal, phase ``setup``."""
    global _signum, _phase, _stopped_in
    _signum, _phase, _stopped_in = None, "setup", None


def request(signum: int) -> str:
    """Record the first signal; returns the phase it arrived in."""
    global _signum, _stopped_in
    if _signum is None:
        _signum, _stopped_in = signum, _phase
    return _phase


def requested() -> int | None:
    return _signum


def current() -> str:
    return _phase


def stopped_in() -> str | None:
    return _stopped_in


def check() -> None:
    """A safe point: in an abandoned phase with a stop requested, raise :class:`Abandoned`."""
    if _signum is not None and _phase in ABANDONED:
        raise Abandoned(_phase)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Run the block as phase ``name`` (restored after it)."""
    global _phase
    before = _phase
    _phase = name
    try:
        check()
        yield
    finally:
        _phase = before


def enter(name: str) -> None:
    """Switch to phase ``name`` (no restore)."""
    global _phase
    _phase = name
