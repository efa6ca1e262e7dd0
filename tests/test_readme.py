"""README.md runs as printed: its marked code blocks are executed here, so an example cannot drift.

A block is marked by an HTML comment on the line before its opening fence (invisible on GitHub):

* ``<!-- readme-test: cli [skip=a,b] -->``: every ``python -m grpo_marl.train|evaluate`` line runs in
  an empty working directory with Hydra's default run directories, with a tiny budget in place of
  the printed one (``total_steps``, episodes, warm-start steps); lines containing a ``skip``
  word are not run (a placeholder such as your own package, or a model that is not installed).
  ``runs/<env>/<algo>_seed1_...`` and ``<run>`` stand for the run directory an earlier line made.
* ``<!-- readme-test: python -->``: the block runs as a script, unchanged, in an empty directory.
* ``<!-- readme-test: output -->``: ``$ command`` lines followed by what the command prints; the
  command runs and every printed line must appear in its output, in order (``/home/me/grpo_marl``
  stands for the working directory; ``$ echo $?`` checks the exit code).
* ``<!-- ci: NAME -->``: the Quickstart commands that ``.ci/run`` runs itself in fresh virtualenvs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, _subprocess_env

README = (ROOT / "README.md").read_text()
HOME = "/home/me/grpo_marl"
#: what replaces the printed budget of a marked command (key -> value)
TINY = {"total_steps": "1", "eval.episodes": "2", "text.sft_steps": "2", "log.progress": "false"}
TINY_EVALUATE = {"episodes": "2"}
RESUME_STEPS = "20000"


@dataclass
class Block:
    kind: str
    options: dict[str, str]
    body: str
    line: int


def blocks(text: str = README) -> list[Block]:
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        m = re.fullmatch(r"<!-- readme-test: (\w+)((?: \w+=\S+)*) -->", line.strip())
        if not m:
            continue
        start = i + 1
        assert lines[start].startswith("```"), f"README.md:{i + 1}: a marker must be followed by a code block"
        end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("```"))
        options = dict(opt.split("=", 1) for opt in m.group(2).split())
        found.append(Block(m.group(1), options, "\n".join(lines[start + 1 : end]), start + 1))
    return found


def _id(block: Block) -> str:
    return f"{block.kind}@README.md:{block.line}"


def run(cmd: list[str] | str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd,
        cwd=cwd,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
        shell=isinstance(cmd, str),
    )


def _key(token: str) -> str:
    return token.lstrip("+~").split("=", 1)[0]


def tiny(argv: list[str], cwd: Path) -> list[str]:
    """The command with the printed budget replaced and run-dir placeholders filled in."""
    out = []
    for token in argv:
        if "..." in token or "<run>" in token:
            key, _, value = token.partition("=")
            pattern = value.replace("...", "*").replace("<run>", "*")
            matches = sorted(cwd.glob(pattern))
            assert matches, f"{token}: no earlier line of the block made a run dir matching {pattern}"
            token = f"{key}={matches[0]}"
        out.append(token)
    module = out[2]
    if module == "grpo_marl.evaluate":
        budget = TINY_EVALUATE
    elif any(t.startswith("resume=") for t in out):
        budget = {"total_steps": RESUME_STEPS, "log.progress": "false"}
    else:
        budget = TINY
    out = [t for t in out[:3]] + [t for t in out[3:] if _key(t) not in budget]
    return out + [f"{k}={v}" for k, v in budget.items()]


def cli_lines(block: Block) -> list[str]:
    skip = [w for w in block.options.get("skip", "").split(",") if w]
    lines = []
    for raw in block.body.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if line.startswith("python -m grpo_marl.") and not any(w in line for w in skip):
            lines.append(line)
    return lines


CLI = [b for b in blocks() if b.kind == "cli"]
PYTHON = [b for b in blocks() if b.kind == "python"]
OUTPUT = [b for b in blocks() if b.kind == "output"]


def test_readme_marks_its_runnable_blocks() -> None:
    """The Training, multi-agent and text command blocks, the Python examples and the error samples."""
    assert len(CLI) >= 3 and len(PYTHON) >= 2 and len(OUTPUT) >= 2
    assert sum(len(cli_lines(b)) for b in CLI) >= 12


def extra_requirements() -> dict[str, list[str]]:
    """pyproject.toml's extras: name -> requirement strings."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


def missing_distributions(extra: str) -> list[str]:
    """The distributions of ``extra`` that are not installed in this Python."""
    from importlib.metadata import PackageNotFoundError, version

    missing = []
    for req in extra_requirements()[extra]:
        name = re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0]
        try:
            version(name)
        except PackageNotFoundError:
            missing.append(name)
    return missing


def refused_for_missing_extra(proc: subprocess.CompletedProcess) -> str | None:
    """The extra named by an exit-2 refusal when that extra really is not installed here, else None.

    A README command that needs an extra this Python lacks is refused up front naming the extra; that
    is the documented behaviour, so the line is skipped (and reported) rather than failed. A refusal
    naming an extra that *is* installed is a real failure.
    """
    m = re.search(r'pip install -e "\.\[([\w-]+)\]"', proc.stderr)
    if proc.returncode != 2 or not m or m.group(1) not in extra_requirements():
        return None
    missing = missing_distributions(m.group(1))
    return f'needs {", ".join(missing)}: pip install -e ".[{m.group(1)}]"' if missing else None


def _command(line: str) -> str:
    """The line without its trailing comment (for skip reasons)."""
    return shlex.join(shlex.split(line, comments=True))


@pytest.mark.slow
@pytest.mark.parametrize("block", CLI, ids=_id)
def test_readme_commands_run(block: Block, tmp_path: Path) -> None:
    skipped = []
    for line in cli_lines(block):
        try:
            argv = tiny([sys.executable, *shlex.split(line, comments=True)[1:]], tmp_path)
        except AssertionError:
            if not skipped:
                raise
            skipped.append(f"{_command(line)} (uses the run dir of a line not run here)")
            continue
        proc = run(argv, tmp_path)
        reason = refused_for_missing_extra(proc)
        if reason:
            skipped.append(f"{_command(line)} ({reason})")
            continue
        assert proc.returncode == 0, f"README.md:{block.line}: {line}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    if skipped:
        pytest.skip("not run here: " + "; ".join(skipped))


@pytest.mark.parametrize("block", PYTHON, ids=_id)
def test_readme_python_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.body + "\n")
    proc = run([sys.executable, str(script)], tmp_path)
    assert proc.returncode == 0, f"README.md:{block.line}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def sessions(block: Block) -> list[tuple[str, list[str]]]:
    """(command, the lines printed after it) for each ``$ command`` of an output block."""
    out: list[tuple[str, list[str]]] = []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


@pytest.mark.parametrize("block", OUTPUT, ids=_id)
def test_readme_error_samples_are_what_the_commands_print(block: Block, tmp_path: Path) -> None:
    code = None
    for command, expected in sessions(block):
        if command == "echo $?":
            assert [str(code)] == expected, f"README.md:{block.line}: exit code {code}, README says {expected}"
            continue
        argv = [sys.executable, *shlex.split(command)[1:]]
        proc = run(argv, tmp_path)
        code = proc.returncode
        printed = [line.rstrip() for line in (proc.stderr + proc.stdout).replace(str(tmp_path), HOME).splitlines()]
        at = 0
        for want in expected:
            while at < len(printed) and printed[at] != want.rstrip():
                at += 1
            assert at < len(printed), (
                f"README.md:{block.line}: `{command}` does not print\n  {want}\nit printed:\n" + "\n".join(printed)
            )
            at += 1
