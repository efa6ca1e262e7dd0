"""The training CLI end to end: one short CartPole run and everything its directory must hold
(resolved config, metrics.jsonl, TensorBoard events, checkpoint, summary.json), a ``-m`` sweep,
``python -m grpo_marl.evaluate`` on the saved run, and the threshold clock."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

pytestmark = pytest.mark.usefixtures("single_thread")

NAMESPACES = ("rollout/", "train/", "eval/", "time/")
TRAIN_KEYS = (
    "rollout/return_mean",
    "train/loss",
    "train/kl",
    "train/clip_fraction",
    "rollout/frac_zero_std_groups",
    "time/sps",
)
TOTAL_STEPS = 4000


@pytest.fixture(scope="module")
def smoke_run(cli, tmp_path_factory) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("cli") / "smoke"
    proc = cli(
        "grpo_marl.train",
        ["env=cartpole", f"total_steps={TOTAL_STEPS}", "eval.every_steps=2000", "checkpoint.every=1", "seed=3"],
        run_dir,
    )
    return run_dir, proc.stdout


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def training_records(run_dir: Path) -> list[dict]:
    return [r for r in records(run_dir) if "train/updates" in r]


def test_prints_final_evaluation(smoke_run) -> None:
    run_dir, stdout = smoke_run
    assert "final eval (20 greedy episodes)" in stdout
    assert f"run dir {run_dir}" in stdout


def test_writes_resolved_config(smoke_run) -> None:
    cfg = OmegaConf.load(smoke_run[0] / "config.yaml")
    assert cfg.env == "cartpole" and cfg.seed == 3 and cfg.total_steps == TOTAL_STEPS
    assert cfg.algo.lr == 0.002  # cartpole's tuned default, merged under the command line
    assert cfg.vec.num_envs == cfg.algo.num_groups * cfg.algo.group_size
    assert cfg.train.threshold == 475.0
    assert "${" not in (smoke_run[0] / "config.yaml").read_text()  # resolved


def test_metrics_jsonl(smoke_run) -> None:
    run_dir = smoke_run[0]
    recs = records(run_dir)
    assert recs
    for rec in recs:
        assert isinstance(rec["step"], int)
        for key in rec:
            assert key == "step" or key.startswith(NAMESPACES), key
    train = training_records(run_dir)
    assert len(train) >= 2
    for rec in train:
        for key in TRAIN_KEYS:
            assert key in rec, key
            assert math.isfinite(rec[key])
        assert 0.0 <= rec["rollout/frac_zero_std_groups"] <= 1.0
        assert 0.0 <= rec["train/clip_fraction"] <= 1.0
        assert rec["train/kl"] >= 0.0
    steps = [r["step"] for r in train]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert [r["train/updates"] for r in train] == list(range(1, len(train) + 1))
    periodic = [r for r in train if "eval/return_mean" in r]
    assert periodic, "eval.every_steps=2000 evaluates during training"
    assert all(r["step"] >= 2000 for r in periodic)


def test_env_step_accounting(smoke_run) -> None:
    run_dir = smoke_run[0]
    train = training_records(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == sum(r["rollout/steps"] for r in train) == train[-1]["step"]
    assert summary["env_steps"] >= TOTAL_STEPS
    assert summary["env_steps"] - train[-2]["step"] > 0 and train[-2]["step"] < TOTAL_STEPS


def test_summary_json(smoke_run) -> None:
    run_dir = smoke_run[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in (
        "eval/return_mean",
        "eval/return_std",
        "env_steps",
        "wall_seconds",
        "time_to_threshold_s",
        "steps_to_threshold",
    ):
        assert key in summary, key
    assert summary["eval/episodes"] >= 20
    assert 9 <= summary["eval/return_mean"] <= 500 and summary["eval/return_std"] >= 0
    assert summary["wall_seconds"] > 0
    # the run's own peak resident memory: torch alone holds more than 50 MB; this run far less than 24 GB
    assert 50 < summary["peak_rss_mb"] < 24_000
    assert summary["status"] == "completed"
    assert summary["steps_to_threshold"] is None and summary["time_to_threshold_s"] is None  # 4k steps
    final = records(run_dir)[-1]
    assert final["eval/return_mean"] == summary["eval/return_mean"]
    assert final["step"] == summary["env_steps"]


def test_tensorboard_events(smoke_run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = smoke_run[0]
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for key in (*TRAIN_KEYS, "eval/return_mean"):
        assert key in tags, key
    events = acc.Scalars("rollout/return_mean")
    train = training_records(run_dir)
    assert [e.step for e in events] == [r["step"] for r in train]
    for e, r in zip(events, train):
        assert e.value == pytest.approx(r["rollout/return_mean"], rel=1e-6)


def test_checkpoint(smoke_run) -> None:
    run_dir = smoke_run[0]
    # the last checkpoint and the one before it (rotation), no temp files
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.pt", "prev.pt"]
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert ckpt["counters"]["env_steps"] == summary["env_steps"]
    assert ckpt["counters"]["updates"] == summary["updates"] == len(training_records(run_dir))
    assert {"modules", "optimizer", "algo", "task", "rng", "config"} <= set(ckpt)
    assert all(torch.isfinite(t).all() for t in ckpt["modules"]["policy"].values())


def test_evaluate_saved_run(smoke_run, run_cli) -> None:
    run_dir = smoke_run[0]
    proc = run_cli(f"run={run_dir}", "episodes=20", "video=true", module="grpo_marl.evaluate")
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["eval/episodes"] == 20
    assert 9 <= result["eval/return_mean"] <= 500 and result["eval/return_std"] >= 0
    assert result["env_steps"] == json.loads((run_dir / "summary.json").read_text())["env_steps"]
    assert "eval/return_mean=" in proc.stdout
    gifs = [Path(p) for p in result["videos"]]
    assert gifs and all(p.exists() and p.stat().st_size > 0 for p in gifs)


def test_evaluate_errors(tmp_path: Path, capsys) -> None:
    from grpo_marl.evaluate import main

    with pytest.raises(SystemExit) as info:
        main([f"run={tmp_path / 'missing'}"])
    assert info.value.code == 2 and "config.yaml not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["episodes=3"])
    assert "run=DIR is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([f"run={tmp_path}", "episdes=3"])
    assert "unknown options ['episdes']" in capsys.readouterr().err


def test_multirun_sweep_over_seeds(run_cli, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    run_cli("-m", "env=cartpole", "seed=1,2", "total_steps=500", "eval.episodes=20", f"hydra.sweep.dir={sweep}")
    summaries = sorted((json.loads(p.read_text()) for p in sweep.glob("*/summary.json")), key=lambda s: s["seed"])
    assert [s["seed"] for s in summaries] == [1, 2]
    for s in summaries:
        assert s["env"] == "cartpole" and s["eval/episodes"] == 20
    dirs = sorted(p.parent.name for p in sweep.glob("*/summary.json"))
    assert all("seed" in d for d in dirs) and len(set(dirs)) == 2
    # distinct seeds, distinct runs
    first = [records(p.parent)[0] for p in sorted(sweep.glob("*/summary.json"))]
    stats = [(r["rollout/return_mean"], r["rollout/return_std"]) for r in first]
    assert stats[0] != stats[1]  # (seeds 1 and 2 happen to share the mean of their first 64 episodes)


def test_unsupported_space_fails_cleanly(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "multibinary"
    proc = run_cli("env=tests.custom_envs:multibinary", "vec.max_steps=1", run_dir=run_dir, check=False)
    assert proc.returncode == 2
    assert "MultiBinary" in proc.stderr and "supported: Discrete" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists()


def test_threshold_clock_and_early_stop(train, tmp_path: Path) -> None:
    summary = train(
        tmp_path / "thr",
        "env=cartpole",
        "total_steps=200000",
        "train.threshold=20",
        "eval.every_steps=1000",
        "train.stop_on_threshold=true",
        "eval.episodes=20",
    )
    assert summary["status"] == "threshold_reached"
    assert summary["steps_to_threshold"] is not None and summary["steps_to_threshold"] <= summary["env_steps"] < 200000
    assert summary["time_to_threshold_s"] is not None and 0 < summary["time_to_threshold_s"] <= summary["wall_seconds"]
    recs = records(tmp_path / "thr")
    reached = [r for r in recs if r.get("eval/threshold_reached") == 1.0]
    assert len(reached) == 1 and reached[0]["step"] == summary["steps_to_threshold"]
    # The training clock leaves the periodic evaluations out: every logged eval record carries the
    # evaluation seconds so far, and train + eval seconds before an eval add up to its wall clock.
    evals = [r for r in recs if "eval/return_mean" in r and "time/train_s" in r]
    assert evals and summary["eval_seconds"] > 0
    for r in evals:
        assert r["time/train_s"] + r["time/eval_s"] == pytest.approx(r["time/wall_s"])
    assert 0 < summary["train_time_to_threshold_s"] < summary["time_to_threshold_s"]
    assert reached[0]["eval/return_mean"] >= 20


def test_final_evaluation_can_use_more_episodes(train, tmp_path: Path, read_metrics) -> None:
    """eval.final_episodes sizes the final evaluation only; periodic ones keep eval.episodes."""
    summary = train(
        tmp_path / "run",
        "env=cartpole",
        "total_steps=2000",
        "eval.every_steps=1000",
        "eval.episodes=3",
        "eval.final_episodes=7",
    )
    periodic = [r["eval/episodes"] for r in read_metrics(tmp_path / "run") if "eval/episodes" in r]
    assert periodic[:-1] and set(periodic[:-1]) == {3.0} and periodic[-1] == 7.0
    assert summary["eval/episodes"] == 7.0


def test_evaluation_at_start(train, tmp_path: Path) -> None:
    """eval.at_start logs the untrained policy's evaluation at step 0 without changing the run;
    a threshold it already meets ends a stop_on_threshold run before any update."""
    args = ("env=cartpole", "total_steps=3000", "eval.every_steps=1500", "eval.episodes=4")
    plain = train(tmp_path / "plain", *args)
    first = train(tmp_path / "first", *args, "eval.at_start=true")
    recs = records(tmp_path / "first")
    assert recs[0]["step"] == 0 and recs[0]["eval/episodes"] == 4.0 and "rollout/steps" not in recs[0]
    assert recs[0]["time/train_s"] + recs[0]["time/eval_s"] == pytest.approx(recs[0]["time/wall_s"])
    # greedy evaluation draws no training randomness: same steps, same final evaluation
    assert first["env_steps"] == plain["env_steps"]
    assert first["eval/return_mean"] == plain["eval/return_mean"]
    assert first["eval_seconds"] > 0
    done = train(tmp_path / "done", *args, "eval.at_start=true", "train.threshold=1", "train.stop_on_threshold=true")
    assert done["status"] == "threshold_reached" and done["steps_to_threshold"] == 0 and done["env_steps"] == 0


def test_evaluate_records_a_pettingzoo_video(run_cli, tmp_path: Path) -> None:
    """``video=true`` on a multi-agent run: the env's own rendering, through the training driver."""
    run_dir = tmp_path / "spread"
    run_cli("env=simple_spread", "total_steps=100", "algo.num_groups=1", "algo.group_size=2", run_dir=run_dir)
    run_cli(f"run={run_dir}", "episodes=1", "video=true", module="grpo_marl.evaluate")
    (gif,) = json.loads((run_dir / "eval.json").read_text())["videos"]
    assert Path(gif).stat().st_size > 1000
