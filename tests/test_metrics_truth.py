"""Training metrics say what happened: the policy's real entropy, a threshold measured for every
env that has one, TensorBoard curves that survive a resume, the final evaluation logged once,
``rollout/return_mean`` in every group mode, and a note when ``total_steps`` is below one update."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from grpo_marl.logging import RunLogger
from grpo_marl.losses import GRPOLoss, PPOLoss
from grpo_marl.trainer import budget_note

pytestmark = pytest.mark.usefixtures("single_thread")

QUIET = ("log.progress=false", "eval.episodes=2")


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of one TensorBoard scalar as TensorBoard itself reads the event files
    (purges of a resumed run applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


# -- 1. entropy ---------------------------------------------------------------------------------------
def test_grpo_logs_the_policys_entropy_without_an_entropy_bonus(train, tmp_path: Path, read_metrics) -> None:
    """``algo.entropy_coef=0`` used to log ``train/entropy = 0.0``; an untrained CartPole policy
    (two actions, near-uniform) has an entropy just under ln 2."""
    run = tmp_path / "run"
    train(run, "env=cartpole", "total_steps=1000", "algo.entropy_coef=0", "log.tensorboard=false", *QUIET)
    first = next(r for r in read_metrics(run) if "train/entropy" in r)
    assert 0.6 < first["train/entropy"] <= math.log(2) + 1e-6


def test_losses_report_no_entropy_they_were_not_given() -> None:
    """No entropy in, no ``entropy`` key out: never a placeholder 0."""
    logp = torch.tensor([-0.7, -0.6], requires_grad=True)
    old, adv, w = torch.tensor([-0.7, -0.7]), torch.tensor([1.0, -1.0]), torch.full((2,), 0.5)
    assert "entropy" not in GRPOLoss()(logp, old, adv, w)
    out = GRPOLoss()(logp, old, adv, w, entropy=torch.tensor([0.5, 0.7]))  # detached: a diagnostic
    assert float(out["entropy"]) == pytest.approx(0.6) and float(out["loss_entropy"]) == 0.0
    values = torch.zeros(2)
    assert "entropy" not in PPOLoss()(logp, old, adv, values, values, values)


# -- 2. thresholds of envs without a tuned evaluation interval ----------------------------------------
def test_an_env_with_a_threshold_gets_periodic_evaluations(resolve) -> None:
    custom = resolve(["env=tests.custom_envs:make_toy", "total_steps=5000"])  # threshold 123, no interval
    assert custom.train.threshold == 123.0 and custom.eval.every_steps == 500
    gym_id = resolve(["env=gym:MountainCar-v0", "total_steps=20000"])  # Gymnasium's reward_threshold -110
    assert gym_id.eval.every_steps == 2000
    # an explicit choice stands, and so do the shipped envs' tuned intervals
    assert resolve(["env=tests.custom_envs:make_toy", "eval.every_steps=0"]).eval.every_steps == 0
    assert resolve(["env=cartpole", "total_steps=5000"]).eval.every_steps == 50000
    # no threshold: nothing to measure, final evaluation only
    assert resolve(["env=tests.custom_envs:bandit"]).eval.every_steps == 0


def test_a_custom_envs_threshold_is_recorded(train, tmp_path: Path, read_metrics) -> None:
    run = tmp_path / "run"
    summary = train(
        run, "env=tests.custom_envs:make_toy", "total_steps=1000", "train.threshold=5", "log.tensorboard=false", *QUIET
    )
    assert OmegaConf.load(run / "config.yaml").eval.every_steps == 100
    first_eval = next(r for r in read_metrics(run) if "eval/return_mean" in r)
    assert summary["steps_to_threshold"] == first_eval["step"] < summary["env_steps"]  # greedy CartPole >= 8


# -- 3. TensorBoard after a resume ----------------------------------------------------------------------
class SimulatedKill(BaseException):
    """Stands in for SIGKILL: escapes every ``except Exception`` and skips the end-of-run work."""


def test_tensorboard_keeps_every_step_after_a_resume(
    train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_metrics, load_checkpoint
) -> None:
    """Killed after its 3rd log line (checkpoint of update 2, written to disk), then resumed: TB
    holds exactly the steps of metrics.jsonl, each once, the checkpoint's step included."""
    run = tmp_path / "run"
    args = ("env=cartpole", "seed=2", "total_steps=6000", "checkpoint.every=2", "eval.every_steps=2500", *QUIET)
    original, calls = RunLogger.log, {"n": 0}

    def log(self: RunLogger, step: int, metrics: dict[str, float]) -> None:
        original(self, step, metrics)
        calls["n"] += 1
        if calls["n"] == 3:
            self.flush()  # the worst case: update 3's points reached the event file
            raise SimulatedKill()

    with monkeypatch.context() as m:
        m.setattr(RunLogger, "log", log)
        with pytest.raises(SimulatedKill):
            train(run, *args)
    checkpoint_step = load_checkpoint(run)["counters"]["env_steps"]
    train(run, f"resume={run}")

    records = read_metrics(run)
    assert checkpoint_step in [r["step"] for r in records]
    for tag in ("train/loss", "rollout/return_mean", "eval/return_mean"):
        expected = [(r["step"], r[tag]) for r in records if tag in r]
        points = scalars(run, tag)
        assert [s for s, _ in points] == [s for s, _ in expected], tag
        assert [v for _, v in points] == pytest.approx([v for _, v in expected], rel=1e-6), tag


# -- 4. the final evaluation, once -----------------------------------------------------------------------
def test_the_final_evaluation_is_logged_once(train, tmp_path: Path, read_metrics) -> None:
    """A periodic evaluation due at the last update is replaced by the final one: one record at
    the last step (the update's metrics and the final evaluation), one TB point per key, and the
    threshold checked on it."""
    run = tmp_path / "run"
    summary = train(
        run,
        "env=cartpole",
        "total_steps=2000",
        "eval.every_steps=1000",
        "eval.final_episodes=3",
        "train.threshold=5",
        *QUIET,
    )
    records = read_metrics(run)
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps))
    last = records[-1]
    assert last["step"] == summary["env_steps"] and "train/loss" in last
    assert last["eval/episodes"] == 3.0 and last["eval/return_mean"] == summary["eval/return_mean"]
    evals = scalars(run, "eval/return_mean")
    assert len({s for s, _ in evals}) == len(evals) and evals[-1] == (
        last["step"],
        pytest.approx(last["eval/return_mean"]),
    )
    # the first periodic evaluation (after update 1) already passed the low threshold
    assert summary["steps_to_threshold"] == records[0]["step"] and records[0]["eval/threshold_reached"] == 1.0


def test_the_final_evaluation_stands_in_for_the_last_periodic_one(train, tmp_path: Path, read_metrics) -> None:
    run = tmp_path / "run"
    summary = train(
        run, "env=cartpole", "total_steps=1000", "eval.every_steps=1000", "train.threshold=5",
        "log.tensorboard=false", *QUIET,
    )  # fmt: skip
    evals = [r for r in read_metrics(run) if "eval/return_mean" in r]
    assert len(evals) == 1 and evals[0]["step"] == summary["env_steps"] == summary["steps_to_threshold"]
    assert evals[0]["eval/threshold_reached"] == 1.0


def test_a_threshold_stop_keeps_the_evaluation_that_stopped_it(train, tmp_path: Path, read_metrics) -> None:
    run = tmp_path / "run"
    summary = train(
        run, "env=cartpole", "total_steps=100000", "eval.every_steps=500", "train.threshold=5",
        "train.stop_on_threshold=true", "eval.final_episodes=3", "log.tensorboard=false", *QUIET,
    )  # fmt: skip
    records = read_metrics(run)
    assert summary["status"] == "threshold_reached" and len(records) == 1
    assert records[0]["eval/episodes"] == 2.0 and records[0]["eval/threshold_reached"] == 1.0
    assert summary["eval/episodes"] == 3.0  # the final evaluation, in summary.json only


# -- 5. rollout/return_mean in every group mode -------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ("env=cartpole", "algo.group_mode=seed"),
        ("env=cartpole", "algo.rollout=stream"),
        ("env=simple_spread", "algo.group_mode=agent"),
        ("env=simple_spread", "algo.group_mode=seed_agent"),
    ],
    ids=["seed", "stream", "agent", "seed_agent"],
)
def test_episode_groups_log_return_mean_every_update(train, tmp_path: Path, read_metrics, args: tuple) -> None:
    run = tmp_path / "run"
    train(run, *args, "total_steps=2500", "algo.num_groups=4", "algo.group_size=4", "log.tensorboard=false", *QUIET)
    updates = [r for r in read_metrics(run) if "train/updates" in r]
    assert len(updates) >= 2 and all("rollout/return_mean" in r for r in updates)


def test_state_groups_log_the_return_of_whole_episodes(train, tmp_path: Path, read_metrics) -> None:
    """Pendulum's 200-step episodes, 100-step branches: an episode ends in a branch restored at
    step >= 100, and its return is the whole episode's (the chain of branches before it included)."""
    run = tmp_path / "run"
    train(
        run, "env=pendulum", "seed=1", "total_steps=12000", "algo.num_groups=4", "algo.group_size=4",
        "algo.branch_horizon=100", "log.tensorboard=false", *QUIET,
    )  # fmt: skip
    updates = [r for r in read_metrics(run) if "train/updates" in r]
    ended = [r for r in updates if r["rollout/episodes_finished"] > 0]
    assert ended and all("rollout/return_mean" in r for r in ended)
    assert all("rollout/return_mean" not in r for r in updates if r["rollout/episodes_finished"] == 0)
    for r in ended:
        assert r["rollout/length_mean"] == 200.0  # whole episodes: the branches before it + this one
        # at most 16.27 a step of cost: a whole episode, far below what one 100-step branch could hold
        assert -16.28 * 200 <= r["rollout/return_min"] <= r["rollout/return_max"] <= 0
        assert r["rollout/return_mean"] < r["rollout/rollout_return_mean"]


# -- 7. a budget below one update -------------------------------------------------------------------------
def test_a_budget_below_one_update_is_noted(train, tmp_path: Path, capsys) -> None:
    summary = train(tmp_path / "ppo", "env=cartpole", "algo=ppo", "total_steps=100", "log.tensorboard=false", *QUIET)
    err = capsys.readouterr().err
    assert (
        "note: total_steps=100 is less than one update's collection (8 envs x 32 steps = 256 env steps); "
        "the run will do one update of 256 steps"
    ) in err
    assert summary["env_steps"] == 256 and summary["updates"] == 1
    train(tmp_path / "grpo", "env=pendulum", "total_steps=100", "log.tensorboard=false", *QUIET)
    assert "up to 3,200 env steps: 64 envs x branches of up to 50 steps" in capsys.readouterr().err


def test_no_note_for_a_budget_of_whole_updates() -> None:
    assert budget_note(512, (256, "8 envs x 32 steps", True)) is None
    note: Any = budget_note(1000, (256, "8 envs x 32 steps", True), world=8)
    assert "(8 envs x 32 steps on each of 8 ranks = 2,048 env steps)" in note
    assert budget_note(10, None) is None  # no bound known (text tasks, envs without a limit)
