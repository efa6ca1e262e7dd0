"""Multi-agent envs through the one control path (ControlTask, EpisodeCollector, generic trainer):
CLI smoke runs per shipped task and algorithm (summary.json with per-group returns), the episode
collector's Batch layout per group mode, resume of the collector state, config errors, and a short
learning test on simple_spread."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_marl.collectors import EpisodeCollector, episode_collector
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import get_spec
from grpo_marl.vec import make_vec_env, resolve_workers

COMMON = ("log.tensorboard=false", "marl.num_workers=0", "eval.episodes=2", "algo.epochs=1", "algo.minibatches=2")


def test_cli_smoke_simple_spread(run_cli, tmp_path: Path) -> None:
    """What a user types; summary.json carries per-group returns."""
    run_cli("env=simple_spread", "total_steps=100", "algo.group_size=2", "algo.num_groups=2", *COMMON)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] >= 100
    assert set(summary["per_group_return"]) == {"agent"}
    assert set(summary["per_agent_return"]) == {"agent_0", "agent_1", "agent_2"}
    assert summary["return_unit"].startswith("mean per-agent")


@pytest.mark.parametrize(
    ("env", "groups", "extra"),
    [
        ("simple_spread", {"agent"}, ["algo.group_mode=agent"]),
        ("simple_spread", {"red", "blue"}, ["marl.groups={red:[agent_0],blue:['agent_[12]']}"]),
        ("simple_speaker_listener", {"speaker", "listener"}, ["algo.group_mode=state", "marl.agent_id=true"]),
        ("pursuit", {"pursuer"}, ["algo.group_mode=seed_agent", "+env_kwargs.max_cycles=20", "marl.share=agent"]),
        ("simple_speaker_listener", {"speaker", "listener"}, ["algo=mappo", "algo.n_envs=4"]),
        ("pursuit", {"pursuer"}, ["algo=ippo", "algo.n_envs=2", "+env_kwargs.max_cycles=20"]),
    ],
)
def test_smoke_per_task_and_algo(train, tmp_path: Path, env: str, groups: set[str], extra: list[str]) -> None:
    grpo = [] if any(e.startswith("algo=") for e in extra) else ["algo.group_size=2", "algo.num_groups=2"]
    summary = train(tmp_path / "run", f"env={env}", "total_steps=100", *grpo, *COMMON, *extra)
    assert summary["status"] == "completed" and summary["env_steps"] >= 100
    assert set(summary["per_group_return"]) == groups
    assert np.isfinite(summary["eval/return_mean"])
    assert summary["agent_groups"]


def test_resume_continues_the_collector(train, tmp_path: Path, read_metrics) -> None:
    run = tmp_path / "run"
    base = ("env=simple_spread", "algo.group_size=2", "algo.num_groups=2", "checkpoint.every=1", *COMMON)
    first = train(run, *base, "total_steps=100")
    assert first["env_steps"] == 100
    second = train(run, "total_steps=200", f"resume={run}")
    assert second["env_steps"] == 200 and second["updates"] == 2


def test_config_errors_are_actionable(resolve) -> None:
    from grpo_marl.config import ConfigError

    with pytest.raises(ConfigError) as err:
        resolve(["env=simple_spread", "marl.share=team", "algo.group_mode=branch", "marl.num_workers=-3"])
    for part in ("marl.share=team", "algo.group_mode=branch", "marl.num_workers=-3"):
        assert part in str(err.value)
    with pytest.raises(ConfigError, match="group_mode=agent needs a multi-agent env"):
        resolve(["env=cartpole", "algo.group_mode=agent"])


def test_tuned_defaults_per_algo(resolve) -> None:
    cfg = resolve(["env=simple_spread"])
    assert cfg.algo.group_mode == "seed" and cfg.algo.group_size == 8 and cfg.total_steps == 2_500_000
    assert cfg.train.threshold == -9.0
    assert resolve(["env=simple_spread", "algo=mappo"]).algo.n_envs == 128  # the MAPPO preset, not GRPO's groups
    cfg = resolve(["env=pursuit", "algo=mappo"])
    assert cfg.algo.n_envs == 16
    for algo in ("mappo", "ippo"):
        cfg = resolve(["env=simple_spread", f"algo={algo}"])
        assert cfg.algo.critic_time and not cfg.algo.bootstrap_truncation and cfg.algo.lr == 0.002
    cfg = resolve(["env=pursuit", "algo=mappo"])  # generic default: time-aware critic, the limit ends the task
    assert cfg.algo.critic_time and not cfg.algo.bootstrap_truncation


def _collector(name: str, mode: str, n_groups: int = 2, g: int = 2, **kw) -> tuple[EpisodeCollector, ActorPolicy]:
    vec = make_vec_env(get_spec(name), n_groups * g, kw, vectorization="sync")
    groups = AgentGroups.from_layout(vec.layout)
    torch.manual_seed(0)
    return episode_collector(vec, groups, n_groups, g, mode=mode, seed=3, env_name=name), ActorPolicy(groups)


def test_batch_layout_seed_groups() -> None:
    col, pol = _collector("simple_spread", "seed")
    batch = col.collect(pol)
    # 2 seed-groups x 3 agents = 6 GRPO groups of G=2; rows = agent trajectories of 25 steps
    assert batch.group_size == 2 and batch.num_groups == 6
    assert batch.mask.shape == (12, 25) and batch.mask.all()
    assert batch["obs"].shape == (12, 25, 18)
    # members of a group: the same agent in two copies of one initial state
    obs = batch.grouped("obs")
    torch.testing.assert_close(obs[:, 0, 0], obs[:, 1, 0])
    agent = batch.grouped("agent")[:, :, 0]
    assert torch.all(agent[:, 0] == agent[:, 1])
    assert batch.metrics["rollout/team_reward_frac"] < 1.0  # local_ratio=0.5: individual parts
    assert col.total_env_steps == 4 * 25


def test_batch_layout_heterogeneous_agent_groups_are_padded() -> None:
    col, pol = _collector("simple_speaker_listener", "agent")
    batch = col.collect(pol)
    # each env has a 1-member speaker group and a 1-member listener group
    assert batch.group_size == 1 and batch.num_groups == 8
    col, pol = _collector("simple_adversary", "seed_agent")
    batch = col.collect(pol)
    # adversary group: 2 copies x 1 agent, padded to width 2 x 2 = 4
    assert batch.group_size == 4
    member_valid = batch.grouped("mask").any(-1)
    assert member_valid.sum(1).tolist() == [2, 4, 2, 4]
    assert set(batch.metrics) >= {"rollout/return_mean/adversary", "rollout/return_mean/agent"}


def test_state_groups_branch_from_one_snapshot() -> None:
    col, pol = _collector("simple_spread", "state")
    col.state_reset_frac = 0.0
    col.collect(pol)  # fills the archive
    assert len(col.archive) == 2
    batch = col.collect(pol)
    obs = batch.grouped("obs")
    torch.testing.assert_close(obs[:, 0, 0], obs[:, 1, 0])  # both branches start from the snapshot
    t0s = {a.t for a in col.archive}
    assert batch.metrics["rollout/branch_start_mean"] > 0 and all(t > 0 for t in t0s)
    assert batch.mask.sum(1).max() < 25  # branches start mid-episode


def test_state_groups_never_get_stuck_at_the_end_of_an_episode() -> None:
    """With every group branching (2 groups: none reset), a collection whose branches all started
    too late to offer a snapshot must not keep replaying its old archive (one step from the end):
    the archive empties and the next collection plays whole episodes from resets."""
    col, pol = _collector("simple_spread", "state")
    lengths = [int(col.collect(pol).mask.sum(1).max()) for _ in range(30)]
    assert lengths[0] == 25
    assert 25 in lengths[10:] and len(set(lengths[10:])) > 3, lengths


def test_collector_state_roundtrip_reproduces_next_batch() -> None:
    col, pol = _collector("simple_spread", "seed")
    col.collect(pol)
    state = {k: (v.copy() if isinstance(v, dict) else v) for k, v in col.state_dict().items()}
    torch.manual_seed(7)
    first = col.collect(pol)
    col2, _ = _collector("simple_spread", "seed")
    col2.load_state_dict(state)
    torch.manual_seed(7)
    second = col2.collect(pol)
    torch.testing.assert_close(first["obs"], second["obs"])
    torch.testing.assert_close(first["rewards"], second["rewards"])


def test_short_learning_run_on_simple_spread(train, tmp_path: Path) -> None:
    """GRPO with seed groups must clearly beat the random policy (-26.3 over 1,000 episodes; the
    standard error of a 50-episode mean is about 1.1) in ~60k steps."""
    summary = train(
        tmp_path / "run",
        "env=simple_spread",
        "total_steps=60000",
        "algo.group_size=8",
        "algo.num_groups=8",
        "eval.episodes=50",
        "seed=3",
        "log.tensorboard=false",
        "marl.num_workers=0",
    )
    assert summary["eval/return_mean"] > -22.5, summary  # measured -20.1 (seed 3, 16 s)


def test_team_reward_makes_agent_groups_zero_variance() -> None:
    """pursuit shares one reward among pursuers: agent groups carry no signal, seed groups do."""
    from grpo_marl.advantages import zero_std_groups

    for mode, expect_all_zero in (("agent", True), ("seed", False)):
        col, pol = _collector("pursuit", mode, n_groups=2, g=2, max_cycles=15)
        batch = col.collect(pol)
        assert batch.metrics["rollout/team_reward_frac"] == 1.0
        returns = (batch.grouped("rewards") * batch.grouped("mask")).sum(-1)
        zero = zero_std_groups(returns, batch.grouped("mask").any(-1))
        if expect_all_zero:
            assert zero.all()
        else:
            assert not zero.all()


def test_custom_aec_env_registered_from_python(registry_sandbox, train, tmp_path: Path) -> None:
    """A user's own PettingZoo env (here mpe2's AEC simple_spread) trains without framework edits."""
    from mpe2 import simple_spread_v3

    registry_sandbox.register_env(
        "my_spread_aec", lambda **kw: simple_spread_v3.env(N=2, max_cycles=10, **kw), kind="pettingzoo"
    )
    summary = train(
        tmp_path / "run", "env=my_spread_aec", "total_steps=40", "algo.group_size=2", "algo.num_groups=2", *COMMON
    )
    assert summary["agent_groups"] == {"agent": ["agent_0", "agent_1"]}
    assert summary["env_steps"] >= 40


@pytest.mark.parametrize(
    "algo",
    [
        ["algo.group_size=2", "algo.num_groups=2", "vec.vectorization=async", "marl.num_workers=2"],
        ["algo=ippo", "algo.n_envs=4", "algo.n_steps=8", "vec.vectorization=sync"],
    ],
    ids=["grpo-workers", "ippo-in-process"],
)
@pytest.mark.parametrize(
    ("factory", "error", "message"),
    [
        ("ToyCrash", "EnvError", "failed during step .*toy env crashed on purpose"),
        ("ToyNaN", "NonFiniteError", "non-finite reward"),
    ],
)
def test_env_failures_stop_a_multi_agent_run_cleanly(
    registry_sandbox, train, tmp_path: Path, algo: list[str], factory: str, error: str, message: str
) -> None:
    """An exception inside a multi-agent env (in a worker process or in this one) and a NaN reward
    stop the run with the named error and a ``failed`` summary, for both collectors."""
    from grpo_marl import errors
    from tests import toy_marl

    registry_sandbox.register_env("toy_failing", getattr(toy_marl, factory), kind="pettingzoo")
    run = tmp_path / "run"
    with pytest.raises(getattr(errors, error), match=message) as err:
        train(run, "env=toy_failing", "total_steps=64", "log.tensorboard=false", *algo)
    assert isinstance(err.value, errors.TrainingStopped)
    assert "vector index" in str(err.value) and "reset seed" in str(err.value)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == str(err.value)


def test_auto_workers() -> None:
    assert resolve_workers(-1, 128, cpus=2) == 0  # no spare core: in-process is faster
    assert resolve_workers(-1, 128, cpus=16) == 15
    assert resolve_workers(-1, 32, cpus=16) == 4
    assert resolve_workers(-1, 8, cpus=16) == 0
    assert resolve_workers(3, 2) == 2
