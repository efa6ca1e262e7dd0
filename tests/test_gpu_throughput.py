"""The GPU throughput benchmark must keep running: its ``--cpu-smoke`` mode (every case, tiny
sizes, CPU) is what this test executes. The GPU figures themselves come from a GPU machine."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_throughput import CASES, main


def test_gpu_throughput_cpu_smoke_runs_every_case(tmp_path: Path) -> None:
    out, rows_path = tmp_path / "table.md", tmp_path / "rows.json"
    rows = main(["--cpu-smoke", "--out", str(out), "--json", str(rows_path)])
    assert [r["case"] for r in rows] == [c.name for c in CASES]
    for r in rows:
        assert r["env_steps"] > 0 and r["env_steps_per_s"] > 0 and r["updates"] >= 1, r
        assert r["peak_gpu_gib"] is None  # CPU: no GPU memory column
    text = [r for r in rows if r["kind"] == "text"]
    assert text and all(r["gen_tokens_per_s"] > 0 and r["train_tokens_per_s"] > 0 for r in text)
    table = out.read_text()
    assert "| case | envs | params |" in table and "simple_spread" in table and "text_qwen2" in table
    assert len(json.loads(rows_path.read_text())) == len(CASES)
