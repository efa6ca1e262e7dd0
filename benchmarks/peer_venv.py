"""A peer framework's own virtualenv, made by the harness on first use.

Some peers pin packages the project cannot share (BenchMARL pulls torchrl and a newer torch than
the project's pin), so they run under their own interpreter: a virtualenv at
``.peers/<name>/`` in the repository (git-ignored), or wherever ``$<ENV_VAR>`` points. On first
use the harness makes it with the project's python (``python -m venv``), installs the ``first``
packages (the torch pin, so pip starts from the project's torch wheel) and then the peer's pinned
packages, and checks that they import at those versions. Every step's output goes to
``<venv>.install.log``; a failure is one line naming the step, the log and how to point the harness
at a ready-made venv instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: ``(argv, log file) -> exit code``: how the steps run (tests pass a fake)
Run = Callable[[Sequence[str], Path], int]


def _run(argv: Sequence[str], log: Path) -> int:
    with open(log, "a") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        return subprocess.run(list(argv), stdout=f, stderr=subprocess.STDOUT, check=False).returncode


def _last_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("ERROR") or "Error" in line]
    return (errors or lines or [""])[-1][:200]


@dataclass(frozen=True)
class PeerVenv:
    """``name``: the folder under ``.peers/`` and the peer's name in messages; ``env_var``: the
    environment variable naming another venv; ``first``: installed before ``packages`` (pins the
    solver's starting point); ``packages``: ``dist==version`` pins, checked after installing;
    ``modules``: imported by the check."""

    name: str
    env_var: str
    packages: tuple[str, ...]
    modules: tuple[str, ...]
    first: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return Path(os.environ.get(self.env_var) or REPO / ".peers" / self.name).absolute()

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def log(self) -> Path:
        return self.path.with_name(self.path.name + ".install.log")

    def _hint(self) -> str:
        return f"set {self.env_var} to a virtualenv with {' '.join(self.packages)}"

    def missing(self) -> str | None:
        """What the venv lacks (None when it has every pinned package at its version and the
        modules import)."""
        if not self.python.exists():
            return f"no python at {self.python}"
        pins = {p.split("==")[0]: p.split("==")[1] for p in self.packages if "==" in p}
        code = (
            "import importlib.metadata as m, sys\n"
            f"for mod in {list(self.modules)!r}:\n"
            "    __import__(mod)\n"
            f"bad = [f'{{d}}=={{v}} (found {{m.version(d)}})' for d, v in {pins!r}.items() if m.version(d) != v]\n"
            "print('; '.join(bad)); sys.exit(1 if bad else 0)\n"
        )
        try:
            proc = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True, check=False)
        except OSError as exc:
            return f"{self.python} does not run ({exc})"
        if proc.returncode == 0:
            return None
        lines = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
        return lines[-1] if lines else f"{self.python} exited {proc.returncode}"

    def ensure(self, run: Run = _run, announce: Callable[[str], None] | None = None) -> str | None:
        """Make the venv if it is not ready; None when it is, else why not (one line)."""
        if self.missing() is None:
            return None
        say = announce or (lambda line: print(line, flush=True))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.log.write_text("")
        except OSError as exc:
            return f"the {self.name} peer virtualenv at {self.path} could not be made: {exc}; {self._hint()}"
        say(f"[bench] making the {self.name} peer virtualenv at {self.path} (once; minutes; log {self.log})")
        steps: list[list[str]] = []
        if not self.python.exists():
            steps.append([sys.executable, "-m", "venv", str(self.path)])
        pip = [str(self.python), "-m", "pip", "install", "-q"]
        if self.first:
            steps.append([*pip, *self.first])
        steps.append([*pip, *self.packages])
        for argv in steps:
            try:
                rc = run(argv, self.log)
            except OSError as exc:
                rc, detail = 127, str(exc)
            else:
                detail = _last_line(self.log)
            if rc != 0:
                shown = " ".join(a if a != str(self.python) else "python" for a in argv[:6])
                return (
                    f"the {self.name} peer virtualenv at {self.path} could not be made: `{shown}` exited {rc}"
                    + (f" ({detail})" if detail else "")
                    + f"; see {self.log}, or {self._hint()}"
                )
        why = self.missing()
        if why is not None:
            return (
                f"the {self.name} peer virtualenv at {self.path} is not usable after installing: {why}; {self._hint()}"
            )
        return None
