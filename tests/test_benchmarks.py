"""Benchmark harness: a --smoke run end to end, the report's aggregation rules, suites, SB3 peer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.report import aggregate, equal_budget_markdown, read_run, table_markdown, write_report
from benchmarks.run import execute, main, plan
from benchmarks.suites import SUITES, EnvEntry, Suite, get_suite, register_suite
from tests.conftest import needs

#: the report's plots (every ``python -m benchmarks.run`` and ``write_report``)
plots = needs("matplotlib", extra="bench")
#: the text suite: its env kind (transformers, tokenizers) and the report
text_suite = needs("matplotlib", "transformers", "tokenizers", extra="bench")


@plots
def test_smoke_run_writes_table_results_and_plots(tmp_path: Path) -> None:
    payload = main(
        [
            "--suite",
            "classic",
            "--smoke",
            "--envs",
            "cartpole",
            "--algos",
            "ppo",
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    out = tmp_path / "classic-smoke"
    assert payload["meta"]["status"] == {"cartpole/ppo/seed1": "ok"}
    run_dir = out / "runs" / "cartpole" / "ppo" / "seed1"
    assert (run_dir / "summary.json").exists() and (run_dir / "runner.log").exists()
    assert "grpo_marl.train" in (run_dir / "runner.log").read_text().splitlines()[0]  # the real CLI

    table = (out / "table.md").read_text()
    assert "SMOKE" in table
    row = next(line for line in table.splitlines() if line.startswith("| CartPole-v1 | ppo"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # the trainer times its evaluations, so the table has a training-clock column (cells[5])
    assert "training s to threshold" in table and "training-clock ratio" in table
    assert cells[2] == "475.0" and "+-" in cells[6] and cells[7].replace(",", "").isdigit()
    # every run's summary.json reports its peak RSS; the table shows the largest over seeds
    assert "peak RSS MB" in table and 50 < float(cells[8].replace(",", "")) < 24_000

    results = json.loads((out / "results.json").read_text())
    r = results["rows"]["cartpole/ppo"]
    assert r["seeds"] == [1] and r["per_seed"]["1"]["env_steps"] == 2048 and r["sps_median"] > 0
    assert r["peak_rss_mb_max"] == r["per_seed"]["1"]["peak_rss_mb"]
    assert r["steps_to_threshold"]["n"] == 1
    (run,) = results["runs"]
    # smoke: eval every 1024 steps over 2048 -> two periodic evaluations with wall-clock stamps
    assert [p["step"] for p in run["curve"]] == [1024, 2048]
    assert all(p["wall_s"] > 0 for p in run["curve"])
    # training clock = wall clock minus the evaluations before that point (none before the first)
    assert run["curve"][0]["train_s"] == pytest.approx(run["curve"][0]["wall_s"])
    assert 0 < run["curve"][1]["train_s"] < run["curve"][1]["wall_s"]
    png = out / "curves_cartpole.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results["plots"] == ["curves_cartpole.png"]

    # A second invocation reuses the finished run instead of training again.
    again = main(
        [
            "--suite",
            "classic",
            "--smoke",
            "--envs",
            "cartpole",
            "--algos",
            "ppo",
            "--seeds",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert again["meta"]["status"] == {"cartpole/ppo/seed1": "reused"}

    # Re-evaluating the final policy with more episodes: same greedy evaluation, one table row.
    from benchmarks.reeval import main as reeval

    text = reeval(["--suite", "classic-smoke", "--episodes", "4", "--out", str(tmp_path)])
    row = next(line for line in text.splitlines() if line.startswith("| cartpole | ppo"))
    evaluated = json.loads((run_dir / "eval.json").read_text())
    assert evaluated["eval/episodes"] == 4 and evaluated["env_steps"] == 2048
    assert f"s1: {evaluated['eval/return_mean']:.2f}" in row
    assert (out / "final_eval.md").read_text() == text


def _fake_run(
    root: Path,
    env: str,
    algo: str,
    seed: int,
    evals: list[tuple[int, float, float]],
    threshold: float,
    finished: bool = True,
) -> None:
    d = root / "runs" / env / algo / f"seed{seed}"
    d.mkdir(parents=True)
    lines = [{"step": s, "eval/return_mean": r, "eval/return_std": 1.0, "time/wall_s": w} for s, r, w in evals]
    lines.insert(1, {"step": evals[0][0], "train/loss": 0.1})  # non-eval lines are ignored
    (d / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"torn')
    if finished:
        hit = next(((s, w) for s, r, w in evals if r >= threshold), (None, None))
        summary = {
            "status": "completed",
            "eval/return_mean": evals[-1][1],
            "eval/return_std": 2.0,
            "env_steps": evals[-1][0],
            "wall_seconds": evals[-1][2],
            "steps_to_threshold": hit[0],
            "time_to_threshold_s": hit[1],
        }
        (d / "summary.json").write_text(json.dumps(summary))


def _unit_runs(tmp_path: Path) -> tuple[Suite, dict]:
    """Fake run dirs of a one-env suite under ``tmp_path`` (as the runners leave them), read back."""
    suite = Suite(
        "unit",
        "unit-test suite",
        [EnvEntry("cartpole", "CartPole-v1", eval_every=100)],
        algos=["grpo", "ppo", "sb3_ppo"],
    )
    thr = 475.0
    # GRPO: 2000, 4000 and one seed never reaching it -> median 4000 (3 seeds, unreached = inf)
    _fake_run(tmp_path, "cartpole", "grpo", 1, [(1000, 100, 1.0), (2000, 480, 2.0)], thr)
    _fake_run(tmp_path, "cartpole", "grpo", 2, [(2000, 100, 1.0), (4000, 490, 3.0)], thr)
    _fake_run(tmp_path, "cartpole", "grpo", 3, [(2000, 100, 1.0), (4000, 200, 3.0)], thr)
    # our PPO: 1000 and 3000 -> median 2000; the cut (unfinished) second seed comes from its curve
    _fake_run(tmp_path, "cartpole", "ppo", 1, [(1000, 480, 4.0), (2000, 500, 8.0)], thr)
    _fake_run(tmp_path, "cartpole", "ppo", 2, [(1000, 100, 4.0), (3000, 500, 12.0)], thr, finished=False)
    # SB3 PPO never reaches it
    _fake_run(tmp_path, "cartpole", "sb3_ppo", 1, [(1000, 100, 5.0)], thr)
    runs = {
        (e, a, int(s[4:])): read_run(tmp_path / "runs" / e / a / s)
        for e in ["cartpole"]
        for a in suite.algos
        for s in ["seed1", "seed2", "seed3"]
        if (tmp_path / "runs" / e / a / s).exists()
    }
    return suite, runs


def test_report_medians_ratios_and_plain_statements(tmp_path: Path) -> None:
    suite, runs = _unit_runs(tmp_path)
    agg = aggregate(suite, runs)
    g = agg["rows"]["cartpole/grpo"]["steps_to_threshold"]
    assert (g["median"], g["min"], g["max"], g["reached"], g["n"]) == (4000, 2000, None, 2, 3)
    p = agg["rows"]["cartpole/ppo"]
    assert p["steps_to_threshold"]["median"] == 2000 and p["finished"] == 1
    assert p["time_to_threshold_s"]["median"] == pytest.approx(8.0)  # (4 + 12) / 2
    assert agg["ratios"]["cartpole"]["ppo"]["steps"] == pytest.approx(2.0)
    assert agg["ratios"]["cartpole"]["ppo"]["wall"] == pytest.approx(3.0 / 8.0)
    assert agg["ratios"]["cartpole"]["sb3_ppo"]["steps"] is None
    meta = {"seeds": [1, 2, 3], "jobs": 2, "cpus": 2, "smoke": False, "generated": "now"}
    md = table_markdown(suite, agg, meta, ["curves_cartpole.png"])
    assert "**grpo needs 2.00x the env steps of ppo** on CartPole-v1 (more samples)" in md
    assert "wall-clock to threshold is 0.38x ppo's on CartPole-v1 (faster)" in md
    assert "grpo reached the threshold on CartPole-v1; sb3_ppo did not (median over seeds)" in md
    assert "not reached (0/1)" in md and "4,000 [2,000-not reached] (2/3)" in md
    assert "ppo (1 cut by budget)" in md


@plots
def test_write_report_writes_the_table_and_one_plot_per_env(tmp_path: Path) -> None:
    suite, runs = _unit_runs(tmp_path)
    meta = {"seeds": [1, 2, 3], "jobs": 2, "cpus": 2, "smoke": False, "generated": "now"}
    payload = write_report(suite, tmp_path, runs, meta)
    assert payload["plots"] == ["curves_cartpole.png"] and (tmp_path / "table.md").exists()
    assert (tmp_path / "curves_cartpole.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "**grpo needs 2.00x the env steps of ppo** on CartPole-v1" in (tmp_path / "table.md").read_text()


def test_text_runs_compare_at_equal_sampled_tokens(tmp_path: Path) -> None:
    """Eval points carry the tokens sampled by then (the last ``rollout/sampled_tokens_total``
    logged before them); the table reads each algorithm at the same token budgets."""
    suite = Suite(
        "tok",
        "token axis",
        [EnvEntry("chain_chat", "chain", eval_every=64, metric="eval/accuracy", metric_digits=2)],
        algos=["grpo", "grpo_state"],
        step_unit="completions",
    )

    def run(algo: str, seed: int, per_update: float, completions: int, accs: list[float]) -> None:
        d = tmp_path / "runs" / "chain_chat" / algo / f"seed{seed}"
        d.mkdir(parents=True)
        lines: list[dict] = [{"step": 0, "eval/accuracy": accs[0], "time/wall_s": 0.0}]
        for i, acc in enumerate(accs[1:], 1):
            lines.append({"step": i * completions, "rollout/sampled_tokens_total": i * per_update})
            lines.append({"step": i * completions, "eval/accuracy": acc, "time/wall_s": float(i)})
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    run("grpo", 1, 1000.0, 64, [0.1, 0.2, 0.3, 0.4, 0.5])  # 4,000 tokens in all
    run("grpo_state", 1, 2000.0, 192, [0.1, 0.4, 0.6])  # 4,000 tokens, longer updates
    run("grpo_state", 2, 2000.0, 192, [0.1])  # just started: only its at-start evaluation, left out
    runs = {
        (k.parent.parent.name, k.parent.name, int(k.name[4:])): read_run(k, "eval/accuracy")
        for k in tmp_path.glob("runs/*/*/seed*")
    }
    assert [p["tokens"] for p in runs[("chain_chat", "grpo_state", 1)]["curve"]] == [0.0, 2000.0, 4000.0]
    md = "\n".join(equal_budget_markdown(suite, runs))
    assert "## chain at equal sampled tokens" in md
    assert "| algo | tokens / completion | 1,000 tokens | 2,000 tokens | 3,000 tokens | 4,000 tokens |" in md
    assert "| grpo (n=1) | 15.6 | 0.20 [0.20, 0.20] | 0.30 [0.30, 0.30] | 0.40 [0.40, 0.40] | 0.50 [0.50, 0.50] |" in md
    # state groups: nothing new until their first update's 2,000 tokens are spent
    assert "| grpo_state (n=1) | 10.4 | 0.10 [0.10, 0.10] | 0.40 [0.40, 0.40] | 0.40 [0.40, 0.40] | 0.60" in md
    assert equal_budget_markdown(*_unit_runs(tmp_path / "rl")) == []  # runs without tokens: no table


def test_compare_at_reads_every_algorithm_at_equal_steps_and_wall_seconds(tmp_path: Path) -> None:
    """``EnvEntry.compare_at``: the last evaluation at or before each budget, median [min, max]
    over seeds; ``*`` where a run had ended before the budget, ``-`` where one had no evaluation."""
    suite, runs = _unit_runs(tmp_path)
    entry = EnvEntry(
        "cartpole", "CartPole-v1", eval_every=100, compare_at={"step": (1000, 2000, 4000), "wall_s": (60, 180)}
    )
    md = "\n".join(equal_budget_markdown(Suite("unit", "u", [entry], algos=suite.algos), runs))
    assert "## CartPole-v1 at equal env steps" in md and "## CartPole-v1 at equal wall-clock time" in md
    assert "| algo | 1,000 env steps | 2,000 env steps | 4,000 env steps |" in md
    # grpo seeds' returns at 1,000 / 2,000 / 4,000 steps: (100, 480, 480*), (-, 100, 490), (-, 100, 200)
    assert "| grpo (n=3) | - | 100.0 [100.0, 480.0] | 480.0 [200.0, 490.0]* |" in md
    assert "| ppo (n=2) | 290.0 [100.0, 480.0] | 300.0 [100.0, 500.0] | 500.0 [500.0, 500.0]* |" in md
    # wall seconds: grpo's points at 1-3 s, ppo's at 4-12 s, so 1 min and 3 min are after every run ended
    assert "| algo | 1 min | 3 min |" in md
    assert "| sb3_ppo (n=1) | 100.0 [100.0, 100.0]* | 100.0 [100.0, 100.0]* |" in md
    with pytest.raises(ValueError, match="compare_at axes \\['tokens'\\] unknown"):
        EnvEntry("cartpole", "CP", 100, compare_at={"tokens": (1.0,)})


def test_suite_registry_and_plan_order(tmp_path: Path) -> None:
    classic = get_suite("classic")
    assert [e.label for e in classic.envs] == ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCarContinuous-v0"]
    assert classic.algos == ["grpo", "ppo", "sb3_ppo"]
    with pytest.raises(KeyError, match="unknown suite"):
        get_suite("no_such_suite")
    suite = register_suite(Suite("unit_plug", "plugged in", [EnvEntry("cartpole", "CP", 100)], ["ppo"]))
    try:
        assert get_suite("unit_plug") is suite
    finally:
        SUITES.pop("unit_plug")
    jobs = plan(
        classic, tmp_path, [1, 2], ["cartpole", "pendulum"], ["grpo", "ppo"], smoke=False, stop_on_threshold=False
    )
    assert [j.key for j in jobs[:4]] == [
        "cartpole/grpo/seed1",
        "cartpole/ppo/seed1",
        "pendulum/grpo/seed1",
        "pendulum/ppo/seed1",
    ]
    assert jobs[1].total_steps == 100_000 and jobs[0].total_steps is None  # GRPO: env default
    # A zero budget starts nothing and says so.
    status = execute(jobs, n_parallel=2, budget_s=0.0, force=False)
    assert set(status.values()) == {"skipped: budget"}


@needs("stable_baselines3", extra="bench")
def test_sb3_peer_writes_the_same_files(tmp_path: Path) -> None:
    from benchmarks.sb3_ppo import run, zoo_kwargs

    hp, n_envs, normalize, steps = zoo_kwargs("CartPole-v1")
    assert (n_envs, normalize, steps, hp["n_steps"], hp["batch_size"]) == (8, False, 100_000, 32, 256)
    assert hp["learning_rate"](0.5) == pytest.approx(0.0005)  # zoo "lin_0.001"
    summary = run(
        "cartpole", seed=1, run_dir=tmp_path, eval_every=256, eval_episodes=3, total_steps=512, threshold=None
    )
    assert summary["algo"] == "sb3_ppo" and summary["env_steps"] == 512
    run_ = read_run(tmp_path)
    assert [p["step"] for p in run_["curve"]] == [256, 512]
    assert {"eval/return_mean", "eval/return_std", "wall_seconds", "steps_to_threshold"} <= set(run_["summary"])
    # the same training clock as the trainer's: evaluations before a point taken out of its wall clock
    assert run_["summary"]["eval_seconds"] > 0 and "train_time_to_threshold_s" in run_["summary"]
    assert run_["curve"][0]["train_s"] == pytest.approx(run_["curve"][0]["wall_s"])
    assert 0 < run_["curve"][1]["train_s"] < run_["curve"][1]["wall_s"]


def _text_smoke(tmp_path: Path, algos: list[str]) -> dict:
    """``--suite text --smoke`` with ``algos``: each writes the same run files; the report
    thresholds eval/accuracy and adds the throughput table. Returns results.json."""
    payload = main(
        ["--suite", "text", "--smoke", "--seeds", "1", "--algos", *algos, "--jobs", "1", "--out", str(tmp_path)]
    )
    out = tmp_path / "text-smoke"
    assert payload["meta"]["status"] == {f"arithmetic/{a}/seed1": "ok" for a in algos}
    log = (out / "runs" / "arithmetic" / "grpo" / "seed1" / "runner.log").read_text().splitlines()[0]
    assert "grpo_marl.train env=arithmetic algo=grpo" in log and "train.threshold=0.95" in log

    table = (out / "table.md").read_text()
    assert "SMOKE" in table and "| completions to threshold |" in table and "final greedy accuracy" in table
    assert "## Throughput" in table and "| step time (s) | completions/s | tokens/s | peak RSS (MB) |" in table
    assert "## grpo relative to TRL's GRPOTrainer" in table
    results = json.loads((out / "results.json").read_text())
    lines = table.splitlines()
    header_line = next(line for line in lines if line.startswith("| env | algo |") and "final greedy" in line)
    header = [c.strip() for c in header_line.strip("|").split("|")]
    for algo in algos:
        prefix = f"| arithmetic (a+b, single digit) | {algo} |"
        row = next(line for line in lines if line.startswith(prefix))
        # columns by header name: the table drops some (e.g. training s to threshold) by which peers ran
        cells = dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))
        accuracy = next(v for k, v in cells.items() if k.startswith("final greedy"))
        assert cells["threshold"] == "0.95" and "+-" in accuracy and "." in accuracy.split()[0]  # 3 decimals
        r = results["rows"][f"arithmetic/{algo}"]
        assert r["threshold"] == 0.95 and 0.0 <= r["final_accuracy_mean"] <= 1.0
        assert r["per_seed"]["1"]["env_steps"] >= 1024
        t = r["throughput"]
        assert t["step_time_s"] > 0 and t["completions_per_s"] > 0 and t["tokens_per_s"] > 0 and t["peak_rss_mb"] > 0
        (run,) = [x for x in results["runs"] if x["algo"] == algo]
        assert run["curve"] and all({"step", "wall_s", "accuracy"} <= set(p) for p in run["curve"])
        # smoke cadence: an evaluation every 512 completions (TRL's runner also scores the untrained
        # model at step 0, the "before" point of the real-model curve)
        steps = [p["step"] for p in run["curve"] if p["step"] > 0]
        assert steps[0] == 512
        summary = run["summary"]
        assert {
            "eval/accuracy",
            "eval/return_mean",
            "wall_seconds",
            "steps_to_threshold",
            "throughput/completions_per_s",
            "throughput/tokens_per_s",
            "throughput/step_time_s",
            "throughput/peak_rss_mb",
        } <= set(summary)
    assert (out / "curves_arithmetic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return results


@text_suite
def test_text_suite_smoke_reports_accuracy_and_throughput(tmp_path: Path) -> None:
    """Our GRPO alone (no TRL needed): the same files, table and throughput columns."""
    results = _text_smoke(tmp_path, ["grpo"])
    assert [r["algo"] for r in results["runs"]] == ["grpo"]


@text_suite
@needs("trl", "datasets", extra="bench")
def test_text_suite_smoke_with_trl_writes_the_same_files(tmp_path: Path) -> None:
    """TRL's GRPOTrainer beside ours: its runner writes what ours does, and lists what it cannot mirror."""
    results = _text_smoke(tmp_path, ["grpo", "trl_grpo"])
    summary = results["runs"][-1]["summary"]
    assert summary["algo"] == "trl_grpo" and summary["env_steps"] == 1024
    assert any("zero_std" in u for u in summary["unmatched"])  # what TRL cannot mirror is listed


def test_trl_runner_without_trl_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import benchmarks.trl_runner as trl_runner
    from benchmarks.runners import RUNNERS, Job

    monkeypatch.setattr(trl_runner.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[bench\]"'):
        trl_runner.main(["env=arithmetic", f"hydra.run.dir={tmp_path}"])
    text = get_suite("text")
    argv = RUNNERS["trl_grpo"](Job(text, text.env("arithmetic"), "trl_grpo", 2, tmp_path, smoke=True))
    assert argv[1:3] == ["-m", "benchmarks.trl_runner"] and "env=arithmetic" in argv and "algo=grpo" in argv
    assert "seed=2" in argv and "total_steps=1024" in argv and f"hydra.run.dir={tmp_path}" in argv


def test_collector_speed_times_the_port_and_gymnasium_in_one_run(tmp_path: Path) -> None:
    """Each env gets one row per vectorization (the port under auto, Gymnasium's envs under sync)
    and the GRPO collector's same-run ratio against the first."""
    from benchmarks.collector_speed import main as collector_speed

    out = tmp_path / "speed.md"
    text = collector_speed(
        ["--envs", "acrobot", "--num-envs", "8", "--seconds", "0.05", "--n-steps", "8", "--out", str(out)]
    )
    rows = [line for line in text.splitlines() if line.startswith("| acrobot")]
    assert [r.split("|")[2].strip() for r in rows] == ["AcrobotVec", "LocalVec"]
    assert rows[0].rstrip().endswith("| 1.00x |") and out.read_text() == text
