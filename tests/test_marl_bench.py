"""The marl benchmark scripts run end to end on tiny settings and write their tables."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tests.conftest import needs

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_references_table(tmp_path: Path, monkeypatch) -> None:
    bench = _load("marl")
    out = tmp_path / "refs.md"
    monkeypatch.setattr(
        sys,
        "argv",
        ["marl.py", "--tasks", "simple_spread", "--references-only", "--ref-episodes", "20", "--out", str(out)],
    )
    bench.main()
    text = out.read_text()
    assert "scripted greedy assignment (20 ep)" in text and "random (20 ep)" in text
    assert out.with_suffix(".json").exists()


def test_speed_table(tmp_path: Path, monkeypatch) -> None:
    speed = _load("marl_speed")
    monkeypatch.setattr(speed, "mpe2_reference", lambda env, seconds: 1.0)
    out = tmp_path / "speed.md"
    monkeypatch.setattr(
        sys, "argv", ["marl_speed.py", "--envs", "16", "--workers", "0", "2", "--episodes", "1", "--out", str(out)]
    )
    speed.main()
    text = out.read_text()
    assert "2 workers, random actions" in text and "GRPO collector x16, 0 workers" in text


def test_curves_align_runs_by_env_steps(tmp_path: Path) -> None:
    import json

    bench = _load("marl")
    for name, recs in (("grpo", [(100_000, -17.0, 120.0)]), ("mappo", [(102_400, -19.5, 300.0)])):
        run = tmp_path / name
        run.mkdir()
        lines = [json.dumps({"step": s, "eval/return_mean": r, "time/wall_s": w}) for s, r, w in recs]
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    text = bench.curves([tmp_path / "grpo", tmp_path / "mappo"])
    assert "| 100,000 | -17.00 (2 min) | -19.50 (5 min) |" in text


def test_marl_suite_plugs_into_the_harness(tmp_path: Path) -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.runners import RUNNERS, Job
    from benchmarks.suites import get_suite

    suite = get_suite("marl")
    assert suite.algos == ["grpo", "mappo", "ippo"]
    assert [e.env for e in suite.envs] == ["simple_spread", "simple_speaker_listener", "pursuit"]
    entry = suite.env("simple_spread")
    argv = RUNNERS["mappo"](Job(suite, entry, "mappo", 1, tmp_path / "run"))
    assert "algo=mappo" in argv and "env=simple_spread" in argv and "total_steps=2500000" in argv
    # Precise final evaluations (1000 episodes) in real runs, none of that cost in --smoke.
    assert "eval.final_episodes=1000" in argv and "eval.episodes=50" in argv
    smoke = RUNNERS["grpo"](Job(suite, entry, "grpo", 1, tmp_path / "smoke", smoke=True))
    assert not any(a.startswith("eval.final_episodes") for a in smoke)


@needs("matplotlib", extra="bench")  # write_report draws the curves
def test_report_states_the_final_evaluation_size(tmp_path: Path) -> None:
    """The table says how many episodes the runs' final evaluations used when it differs from
    the periodic ones (read from the runs' summaries, not assumed from the suite)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import json

    from benchmarks.report import read_run, write_report
    from benchmarks.suites import get_suite

    suite = get_suite("marl")
    runs = {}
    for seed, episodes in ((1, 1000), (2, 1000)):
        run_dir = tmp_path / "runs" / "simple_spread" / "grpo" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text(
            json.dumps({"step": 100, "time/wall_s": 1.0, "eval/return_mean": -10.0}) + "\n"
        )
        (run_dir / "summary.json").write_text(
            json.dumps(
                {
                    "env_steps": 100,
                    "wall_seconds": 1.0,
                    "eval/return_mean": -9.0,
                    "eval/return_std": 3.0,
                    "eval/episodes": episodes,
                    "status": "finished",
                }
            )
        )
        runs[("simple_spread", "grpo", seed)] = read_run(run_dir)
    meta = {"seeds": [1, 2], "jobs": 1, "cpus": 2, "smoke": False, "generated": "now"}
    write_report(suite, tmp_path, runs, meta)
    table = (tmp_path / "table.md").read_text()
    assert "final evaluation of mpe2 simple_spread_v3 (N=3, 25 steps): 1000 episodes" in table
    assert "speaker_listener_v4: " not in table  # no runs there: nothing claimed
