"""PPO (one implementation; ``ppo``/``ippo``/``mappo`` differ only in critic options): GAE with
truncation bootstrapping (hand-checked, per-agent observation and centralized-state critics), the
loss terms, value clipping, the step collector's streaming semantics, a CLI run and exact resume."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from grpo_marl.algos import get_algo
from grpo_marl.algos.ppo import PPO, RunningReturnScale
from grpo_marl.batch import Batch
from grpo_marl.groups import AgentGroups
from grpo_marl.losses import LOSSES, PPOLoss
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.settings import PPOSettings
from grpo_marl.vec.base import layout_of


# ------------------------------------------------------------------------- prepare / GAE
class ValueIsInput(nn.Module):
    """A 'critic' whose value is the first observation feature (or, with ``state=True``, the first
    global-state feature): makes GAE checkable by hand. Same call as :class:`Critic`."""

    def __init__(self, state: bool = False) -> None:
        super().__init__()
        self.state = state

    def forward(
        self, policy: nn.Module, obs: Tensor, agent: Tensor, state: Tensor | None = None, time: Tensor | None = None
    ) -> Tensor:
        if self.state:
            assert state is not None, "a centralized critic gets the global state"
            return state[..., 0].float()
        return obs[..., 0].float()


def make_ppo(gamma: float, lam: float, n_envs: int = 1, agents: int = 1, state_dim: int = 0, **algo: object) -> PPO:
    obs_space = gym.spaces.Box(-100, 100, (1,), np.float32)
    names = ("agent",) if agents == 1 else tuple(f"agent_{i}" for i in range(agents))
    layout = layout_of(names, (obs_space,) * agents, (gym.spaces.Discrete(2),) * agents, state_dim=state_dim)
    policy = ActorPolicy(AgentGroups.from_layout(layout), hidden=(8,))
    # PPO's section at its defaults (SB3's: clip 0.2, vf_coef 0.5, normalized advantages, ...)
    cfg = OmegaConf.merge(OmegaConf.structured(PPOSettings), {"gamma": gamma, "gae_lambda": lam, **algo})
    task = SimpleNamespace(
        policy=policy,
        cfg=OmegaConf.create({"policy": {"hidden": [8], "activation": "tanh"}, "total_steps": 1000}),
        vec=SimpleNamespace(num_envs=n_envs, layout=layout),
        input_keys=("obs", "actions", "agent"),
        env_steps=0,
    )
    ppo = PPO(cfg, task, torch.device("cpu"))  # type: ignore[arg-type]
    ppo.critic = ValueIsInput(state=bool(algo.get("critic_state")))  # type: ignore[assignment]
    return ppo


def one_env_batch(
    values: list[float],
    rewards: list[float],
    terminated: list[bool],
    truncated: list[bool],
    final_value: float,
    next_value: float,
) -> Batch:
    """One (env, agent) row of a step collection; the critic reads values off the observations."""
    t = len(values)
    final_obs = torch.zeros(1, t, 1)
    for i in range(t):
        if terminated[i] or truncated[i]:
            final_obs[0, i, 0] = final_value
    return Batch(
        {
            "obs": torch.tensor(values, dtype=torch.float32).reshape(1, t, 1),
            "actions": torch.zeros(1, t, dtype=torch.long),
            "agent": torch.zeros(1, t, dtype=torch.long),
            "logp": torch.zeros(1, t),
            "rewards": torch.tensor([rewards], dtype=torch.float32),
            "mask": torch.ones(1, t, dtype=torch.bool),
            "terminated": torch.tensor([terminated]),
            "truncated": torch.tensor([truncated]),
            "final_obs": final_obs,
            "time": torch.zeros(1, t),
            "next_obs": torch.tensor([[next_value]], dtype=torch.float32),
            "next_time": torch.zeros(1),
        },
        group_size=1,
    )


def test_gae_bootstraps_truncation_from_final_obs() -> None:
    # V(o) = 1, 2, 3; step 1 is a time-limit cut whose last real obs has V = 10; V(next_obs) = 4.
    # gamma = 0.5, lam = 0.5:
    #   t=2: delta = 1 + 0.5*4 - 3 = 0                       -> A2 = 0
    #   t=1: r' = 1 + 0.5*10 = 6 (SB3 bootstrap), episode ends: delta = 6 - 2 = 4 -> A1 = 4
    #   t=0: delta = 1 + 0.5*2 - 1 = 1; A0 = 1 + 0.5*0.5*4 = 2
    ppo = make_ppo(gamma=0.5, lam=0.5)
    batch = one_env_batch([1, 2, 3], [1, 1, 1], [False, False, False], [False, True, False], 10.0, 4.0)
    data, metrics = ppo.prepare(batch)
    torch.testing.assert_close(data["advantages"], torch.tensor([2.0, 4.0, 0.0]))
    torch.testing.assert_close(data["returns"], torch.tensor([3.0, 6.0, 3.0]))
    torch.testing.assert_close(data["old_values"], torch.tensor([1.0, 2.0, 3.0]))
    assert set(data) == {"obs", "actions", "agent", "logp", "time", "advantages", "returns", "old_values"}
    assert "train/explained_variance" in metrics


def test_gae_truncation_without_bootstrapping_ends_the_episode() -> None:
    # bootstrap_truncation=false (ippo/mappo: a time-aware finite horizon): the cut is an end.
    #   t=1: delta = 1 - 2 = -1 -> A1 = -1; t=0: A0 = 1 + 0.25 * -1 = 0.75
    ppo = make_ppo(gamma=0.5, lam=0.5, bootstrap_truncation=False)
    batch = one_env_batch([1, 2, 3], [1, 1, 1], [False, False, False], [False, True, False], 10.0, 4.0)
    data, _ = ppo.prepare(batch)
    torch.testing.assert_close(data["advantages"], torch.tensor([0.75, -1.0, 0.0]))


def test_gae_termination_does_not_bootstrap() -> None:
    # Same, but step 1 is a real termination: r' = 1, A1 = 1 - 2 = -1; A0 = 1 + 0.25 * -1 = 0.75.
    ppo = make_ppo(gamma=0.5, lam=0.5)
    batch = one_env_batch([1, 2, 3], [1, 1, 1], [False, True, False], [False, False, False], 10.0, 4.0)
    data, _ = ppo.prepare(batch)
    torch.testing.assert_close(data["advantages"], torch.tensor([0.75, -1.0, 0.0]))
    # Terminated *and* truncated in the same step (gymnasium allows it): termination wins.
    batch = one_env_batch([1, 2, 3], [1, 1, 1], [False, True, False], [False, True, False], 10.0, 4.0)
    data2, _ = ppo.prepare(batch)
    torch.testing.assert_close(data2["advantages"], data["advantages"])


def test_gae_last_step_bootstraps_from_next_obs_with_lambda_one() -> None:
    # No episode end: lam=1, gamma=1 gives Monte-Carlo return-to-go + V(next_obs) minus V.
    ppo = make_ppo(gamma=1.0, lam=1.0)
    batch = one_env_batch([0, 0, 0], [1, 2, 3], [False] * 3, [False] * 3, 0.0, 10.0)
    data, _ = ppo.prepare(batch)
    torch.testing.assert_close(data["returns"], torch.tensor([16.0, 15.0, 13.0]))


def test_gae_per_agent_rows_and_centralized_state() -> None:
    """Two agents of one env are two rows; a centralized critic (critic_state, MAPPO) values both
    from the global state, bootstrapping a cut from ``final_state`` and the last step from
    ``next_state``. Agent 1 leaves after step 0 (its later steps are masked out).

    gamma = 0.5, lam = 1; V(state) = 1, 2, 3, V(final_state at t=1) = 10, V(next_state) = 4:
      agent 0 (cut at t=1): r' = 1 + 0.5*10 = 6; A1 = 6 - 2 = 4; A0 = 1 + 0.5*2 - 1 + 0.5*4 = 3;
        t=2 restarts: A2 = 1 + 0.5*4 - 3 = 0
      agent 1 (terminated at t=0 with reward 5): A0 = 5 - 1 = 4
    """
    ppo = make_ppo(gamma=0.5, lam=1.0, agents=2, state_dim=2, critic_state=True)
    t = 3
    state = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    final_state = torch.zeros(t, 2)
    final_state[1, 0] = 10.0
    batch = Batch(
        {
            "obs": torch.full((2, t, 1), 99.0),  # the critic must not read observations
            "actions": torch.zeros(2, t, dtype=torch.long),
            "agent": torch.tensor([[0] * t, [1] * t]),
            "logp": torch.zeros(2, t),
            "rewards": torch.tensor([[1.0, 1.0, 1.0], [5.0, 0.0, 0.0]]),
            "mask": torch.tensor([[True, True, True], [True, False, False]]),
            "terminated": torch.tensor([[False, False, False], [True, False, False]]),
            "truncated": torch.tensor([[False, True, False], [False, False, False]]),
            "final_obs": torch.zeros(2, t, 1),
            "time": torch.zeros(2, t),
            "state": state.expand(2, t, 2).clone(),
            "final_state": final_state.expand(2, t, 2).clone(),
            "next_obs": torch.zeros(2, 1),
            "next_time": torch.zeros(2),
            "next_state": torch.tensor([[4.0, 0.0], [4.0, 0.0]]),
        },
        group_size=1,
    )
    data, _ = ppo.prepare(batch)
    torch.testing.assert_close(data["advantages"], torch.tensor([3.0, 4.0, 0.0, 4.0]))
    torch.testing.assert_close(data["agent"], torch.tensor([0, 0, 0, 1]))
    assert "state" in data  # the loss's critic call reads it too


def test_named_configs_differ_only_in_critic_options() -> None:
    """``ppo``, ``ippo`` and ``mappo`` are one algorithm; ippo and mappo configs differ only in the
    centralized critic."""
    assert get_algo("ppo") is get_algo("ippo") is get_algo("mappo") is PPO
    from tests.conftest import compose_config

    mappo, ippo = (compose_config([f"algo={name}"]).algo for name in ("mappo", "ippo"))
    differ = {k for k in mappo if mappo[k] != ippo[k]}
    assert differ == {"name", "critic_state"}
    assert mappo["critic_state"] and not ippo["critic_state"]


def test_reward_scaling_matches_vecnormalize_recurrence() -> None:
    scale = RunningReturnScale(num_envs=2, gamma=0.9)
    rewards = np.array([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]])
    dones = np.array([[False, True, False], [False, False, False]])
    out = scale(rewards, dones)
    # Recompute VecNormalize's per-step recurrence by hand.
    ret, mean, var, count = np.zeros(2), 0.0, 1.0, 1e-4
    for t in range(3):
        ret = ret * 0.9 + rewards[:, t]
        bm, bv, n = ret.mean(), ret.var(), 2
        delta, tot = bm - mean, count + n
        mean, var, count = mean + delta * n / tot, (var * count + bv * n + delta**2 * count * n / tot) / tot, tot
        np.testing.assert_allclose(out[:, t], rewards[:, t] / np.sqrt(var + 1e-8), rtol=1e-5)
        ret[dones[:, t]] = 0.0
    assert scale.ret[0] == pytest.approx(3.0)  # reset after the episode end, then one reward


# ------------------------------------------------------------------------------- loss
def test_ppo_loss_registered_and_terms() -> None:
    assert LOSSES["ppo"] is PPOLoss
    loss = PPOLoss(clip_eps=0.2, vf_coef=0.5, entropy_coef=0.01)
    logp = torch.log(torch.tensor([0.5, 0.5], requires_grad=True))
    old = torch.log(torch.tensor([0.25, 0.5]))  # ratios 2.0 and 1.0
    adv = torch.tensor([1.0, -1.0])
    values, old_values, returns = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), torch.tensor([2.0, 2.0])
    out = loss(logp, old, adv, values, old_values, returns, entropy=torch.tensor([0.7, 0.7]))
    # surrogate: min(2*1, 1.2*1) = 1.2 and min(1*-1, 1*-1) = -1 -> loss_policy = -(0.2/2) = -0.1
    assert float(out["loss_policy"].detach()) == pytest.approx(-0.1)
    assert float(out["loss_value"]) == pytest.approx(0.5 * 0.5)  # vf_coef * mean([1, 0])
    assert float(out["loss_entropy"]) == pytest.approx(-0.007)
    assert float(out["loss"].detach()) == pytest.approx(-0.1 + 0.25 - 0.007)
    assert float(out["clip_fraction"]) == pytest.approx(0.5)
    # A schedule may pass a different clip range per update.
    out = loss(logp, old, adv, values, old_values, returns, clip_eps=0.5)
    assert float(out["loss_policy"]) == pytest.approx(-(1.5 - 1.0) / 2)


def test_value_clipping_is_pessimistic() -> None:
    old_values = torch.tensor([1.0, 1.0])
    values = torch.tensor([1.5, 1.5], requires_grad=True)
    returns = torch.tensor([2.0, 1.0])
    clipped = PPOLoss(clip_vf=0.1, vf_coef=1.0)
    # element 0: unclipped (1.5-2)^2 = 0.25, clipped value 1.1 -> (1.1-2)^2 = 0.81 -> max 0.81
    # element 1: unclipped (1.5-1)^2 = 0.25, clipped (1.1-1)^2 = 0.01 -> max 0.25
    assert float(clipped.value_loss(values, old_values, returns)) == pytest.approx((0.81 + 0.25) / 2)
    # The clipped branch carries no gradient: only element 1 moves.
    clipped.value_loss(values, old_values, returns).backward()
    assert values.grad[0] == 0 and values.grad[1] == pytest.approx(0.5)
    assert float(PPOLoss(clip_vf=None).value_loss(values, old_values, returns)) == pytest.approx(0.25)
    assert PPOLoss(clip_vf=0.0).clip_vf is None


# --------------------------------------------------------------------------- validation
def test_validator_messages(resolve) -> None:
    from grpo_marl.config import ConfigError

    cfg = resolve(["env=cartpole", "algo=ppo"])
    assert cfg.vec.num_envs == cfg.algo.n_envs == 8
    assert cfg.algo.minibatches == 1  # 8 envs * 32 steps / batch 256 (rl-zoo CartPole)
    bad = cfg.copy()
    bad.algo.gae_lambda = 1.5
    bad.algo.clip_eps = 1.2
    from grpo_marl.config import validate

    with pytest.raises(ConfigError) as info:  # ranges are the schema's, one rule each
        validate(bad)
    assert "algo.gae_lambda=1.5 must be in [0, 1]" in str(info.value) and "algo.clip_eps=1.2" in str(info.value)
    with pytest.raises(ConfigError, match="algo.n_envs"):
        resolve(["env=cartpole", "algo=ppo", "vec.num_envs=3"])


# -------------------------------------------------------------------- collector + CLI
def test_step_collector_streams_episodes_across_updates(resolve) -> None:
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.control import ControlTask

    cfg = resolve(["env=cartpole", "algo=ppo", "algo.n_envs=4", "algo.n_steps=64"])
    task = ControlTask(cfg, get_spec("cartpole"), torch.device("cpu"), collector="steps")
    b1 = task.collect(task.policy)
    b2 = task.collect(task.policy)
    assert b1.mask.shape == (4, 64) and bool(b1.mask.all())
    assert task.env_steps == 2 * 4 * 64
    # The second batch starts where the first stopped (no reset at the update boundary).
    torch.testing.assert_close(b2["obs"][:, 0], b1["next_obs"])
    # A random policy ends CartPole episodes within 64 steps: final_obs holds the observation that
    # ended the episode, and the collector resets the finished env in the same step (vector envs do
    # not reset themselves), so the next stored obs is a fresh start at episode time 0.
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    done = b1["terminated"] | b1["truncated"]
    assert bool(done.any())
    for e, t in torch.nonzero(done).tolist():
        single = CartPoleEnv()
        single.reset(seed=0)
        single.state = b1["obs"][e, t].double().numpy().copy()
        last, _, terminated, _, _ = single.step(int(b1["actions"][e, t]))
        np.testing.assert_allclose(b1["final_obs"][e, t].numpy(), last, rtol=1e-5, atol=1e-5)
        assert terminated == bool(b1["terminated"][e, t])
        if t + 1 < 64:
            assert float(b1["obs"][e, t + 1].abs().max()) <= 0.05  # CartPole starts in [-0.05, 0.05]
            assert float(b1["time"][e, t + 1]) == 0.0 and float(b1["time"][e, t]) > 0.0
    not_done = ~done
    assert (b1["final_obs"][not_done] == 0).all()
    assert "rollout/return_mean" in b1.metrics
    task.close()


def test_ppo_cli_run(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "ppo"
    proc = run_cli(
        "env=cartpole",
        "algo=ppo",
        "total_steps=1024",
        "eval.every_steps=512",
        "eval.episodes=4",
        "log.tensorboard=false",
        run_dir=run_dir,
    )
    assert "algo=ppo" in proc.stdout
    # the critic's time input was a read-only numpy broadcast: torch warned on every PPO run
    assert "not writable" not in proc.stderr and "UserWarning" not in proc.stderr, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algo"] == "ppo" and summary["env_steps"] == 1024  # 4 updates of 8 envs x 32 steps
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss_value" in r]
    assert len(train) == 4
    for key in (
        "train/loss_policy",
        "train/loss_entropy",
        "train/approx_kl",
        "train/clip_fraction",
        "train/explained_variance",
        "train/clip_range",
    ):
        assert key in train[0]
    assert train[-1]["train/clip_range"] < 0.2  # rl-zoo's linear clip schedule for CartPole
    assert sum("eval/return_mean" in r for r in records) >= 2
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert "critic" in ckpt["modules"]  # the trainer checkpoints the critic


# ----------------------------------------------------------------------------- resume
@pytest.mark.parametrize(
    "env,extra",
    [
        # native CartPole vector env: terminations, env RNG draws reset states
        ("cartpole", ["algo.n_envs=4", "algo.n_steps=32"]),
        # Sync vector env: a 200-step time limit cut mid-batch (truncation bootstrapping), plus the
        # streaming reward scaler and the running observation normaliser
        (
            "pendulum",
            [
                "algo.n_envs=2",
                "algo.n_steps=96",
                "algo.batch_size=64",
                "algo.normalize_reward=true",
                "policy.normalize_obs=true",
                "algo.epochs=2",
            ],
        ),
    ],
)
def test_ppo_resume_is_exact(train, read_metrics, load_checkpoint, tmp_path: Path, env: str, extra: list[str]) -> None:
    per_update = 128 if env == "cartpole" else 192
    # Schedules decay over total_steps, which the interrupted run sets lower: keep them constant.
    common = [
        f"env={env}",
        "algo=ppo",
        "log.tensorboard=false",
        "checkpoint.every=1",
        "eval.every_steps=0",
        "eval.episodes=2",
        "algo.lr_schedule=constant",
        "algo.clip_schedule=constant",
        *extra,
    ]
    full, part = tmp_path / "full", tmp_path / "part"
    train(full, *common, f"total_steps={4 * per_update}")
    train(part, *common, f"total_steps={2 * per_update}")
    train(part, f"resume={part}", f"total_steps={4 * per_update}")
    a, b = load_checkpoint(full), load_checkpoint(part)
    for name in ("policy", "critic"):
        for key, value in a["modules"][name].items():
            torch.testing.assert_close(b["modules"][name][key], value, rtol=0, atol=0, msg=f"{name}.{key}")
    ma = [r for r in read_metrics(full) if "train/loss" in r]
    mb = [r for r in read_metrics(part) if "train/loss" in r]
    assert [r["step"] for r in ma] == [r["step"] for r in mb]
    for ra, rb in zip(ma, mb):
        for key in ("train/loss", "train/loss_value", "train/approx_kl", "rollout/episodes_finished"):
            assert ra[key] == rb[key], (key, ra["step"])
