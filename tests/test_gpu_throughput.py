"""The GPU throughput benchmark must keep running: its ``--cpu-smoke`` mode (every case, tiny
sizes, CPU) is what these tests execute. The GPU figures themselves come from a GPU machine.

The control and multi-agent cases need the base install only; the text cases (a random Qwen2)
need the text extra, so they are a test of their own that skips without it."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_throughput import CASES, main
from tests.conftest import needs

BASE_CASES = [c.name for c in CASES if c.kind != "text"]
TEXT_CASES = [c.name for c in CASES if c.kind == "text"]


def _smoke(tmp_path: Path, names: list[str]) -> tuple[list[dict], str]:
    out, rows_path = tmp_path / "table.md", tmp_path / "rows.json"
    rows = main(["--cpu-smoke", "--only", ",".join(names), "--out", str(out), "--json", str(rows_path)])
    assert [r["case"] for r in rows] == names
    for r in rows:
        assert r["env_steps"] > 0 and r["env_steps_per_s"] > 0 and r["updates"] >= 1, r
        assert r["peak_gpu_gib"] is None  # CPU: no GPU memory column
    table = out.read_text()
    assert "| case | envs | params |" in table
    assert len(json.loads(rows_path.read_text())) == len(names)
    return rows, table


def test_gpu_throughput_cpu_smoke_runs_every_control_and_marl_case(tmp_path: Path) -> None:
    assert BASE_CASES and TEXT_CASES and len(BASE_CASES) + len(TEXT_CASES) == len(CASES)
    _, table = _smoke(tmp_path, BASE_CASES)
    assert "simple_spread" in table


@needs("transformers", "tokenizers", extra="text")
def test_gpu_throughput_cpu_smoke_runs_every_text_case(tmp_path: Path) -> None:
    rows, table = _smoke(tmp_path, TEXT_CASES)
    assert all(r["kind"] == "text" and r["gen_tokens_per_s"] > 0 and r["train_tokens_per_s"] > 0 for r in rows)
    assert "text_qwen2" in table
