"""PPO baseline: GAE with truncation bootstrapping (hand-checked), the loss terms, value clipping,
the step collector's streaming semantics, a CLI run and exact resume."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from grpo_marl.algos.ppo import PPO, RunningReturnScale, _validate_ppo
from grpo_marl.batch import Batch
from grpo_marl.losses import LOSSES, PPOLoss
from grpo_marl.policies.mlp import MLPPolicy


# ------------------------------------------------------------------------- prepare / GAE
class ObsIsValue(nn.Module):
    """A 'critic' whose value is the first observation feature: makes GAE checkable by hand."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., 0]


def make_ppo(gamma: float, lam: float, n_envs: int = 1, **algo: object) -> PPO:
    obs_space = gym.spaces.Box(-100, 100, (1,), np.float32)
    policy = MLPPolicy(obs_space, gym.spaces.Discrete(2), hidden=(8,))
    cfg = OmegaConf.create(
        {
            "gamma": gamma, "gae_lambda": lam, "clip_eps": 0.2, "clip_schedule": "constant", "clip_vf": None,
            "vf_coef": 0.5, "entropy_coef": 0.0, "normalize_reward": False, "normalize_advantage": True,
            "value_hidden": None, **algo,
        }
    )
    task = SimpleNamespace(
        policy=policy,
        cfg=OmegaConf.create({"policy": {"hidden": [8], "activation": "tanh"}, "total_steps": 1000}),
        vec=SimpleNamespace(num_envs=n_envs),
        env_steps=0,
    )
    ppo = PPO(cfg, task, torch.device("cpu"))
    ppo.value_net = ObsIsValue()
    return ppo


def one_env_batch(values: list[float], rewards: list[float], terminated: list[bool], truncated: list[bool],
                  final_value: float, next_value: float) -> Batch:
    t = len(values)
    final_obs = torch.zeros(1, t, 1)
    for i in range(t):
        if terminated[i] or truncated[i]:
            final_obs[0, i, 0] = final_value
    return Batch(
        {
            "obs": torch.tensor(values, dtype=torch.float32).reshape(1, t, 1),
            "actions": torch.zeros(1, t, dtype=torch.long),
            "logp": torch.zeros(1, t),
            "rewards": torch.tensor([rewards], dtype=torch.float32),
            "mask": torch.ones(1, t, dtype=torch.bool),
            "terminated": torch.tensor([terminated]),
            "truncated": torch.tensor([truncated]),
            "final_obs": final_obs,
            "next_obs": torch.tensor([[next_value]], dtype=torch.float32),
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
    assert set(data) == {"obs", "actions", "logp", "advantages", "returns", "old_values"}
    assert "train/explained_variance" in metrics


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
    errors = _validate_ppo(bad)
    assert any("gae_lambda" in e for e in errors) and any("clip_eps" in e for e in errors)
    with pytest.raises(ConfigError, match="algo.n_envs"):
        resolve(["env=cartpole", "algo=ppo", "vec.num_envs=3"])


# -------------------------------------------------------------------- collector + CLI
def test_step_collector_streams_episodes_across_updates(resolve) -> None:
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.gym import GymTask

    cfg = resolve(["env=cartpole", "algo=ppo", "algo.n_envs=4", "algo.n_steps=64"])
    task = GymTask(cfg, get_spec("cartpole"), torch.device("cpu"), collector="steps")
    b1 = task.collect(task.policy)
    b2 = task.collect(task.policy)
    assert b1.mask.shape == (4, 64) and bool(b1.mask.all())
    assert task.env_steps == 2 * 4 * 64
    # The second batch starts where the first stopped (no reset at the update boundary).
    torch.testing.assert_close(b2["obs"][:, 0], b1["next_obs"])
    # A random policy ends CartPole episodes within 64 steps: final_obs holds the last real obs,
    # and the next stored obs is a fresh reset state (SAME_STEP autoreset).
    done = b1["terminated"] | b1["truncated"]
    assert bool(done.any())
    e, t = [int(i) for i in torch.nonzero(done)[0]]
    assert bool((b1["final_obs"][e, t] != 0).any())
    if t + 1 < 64:
        assert float(b1["obs"][e, t + 1].abs().max()) <= 0.05  # CartPole resets in [-0.05, 0.05]
    assert "rollout/return_mean" in b1.metrics
    task.close()


def test_ppo_cli_run(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "ppo"
    proc = run_cli("env=cartpole", "algo=ppo", "total_steps=1024", "eval.every_steps=512", "eval.episodes=4",
                   "log.tensorboard=false", run_dir=run_dir)
    assert "algo=ppo" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algo"] == "ppo" and summary["env_steps"] == 1024  # 4 updates of 8 envs x 32 steps
    records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss_value" in r]
    assert len(train) == 4
    for key in ("train/loss_policy", "train/loss_entropy", "train/approx_kl", "train/clip_fraction",
                "train/explained_variance", "train/clip_range"):
        assert key in train[0]
    assert train[-1]["train/clip_range"] < 0.2  # rl-zoo's linear clip schedule for CartPole
    assert sum("eval/return_mean" in r for r in records) >= 2
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert "value" in ckpt["modules"]  # the trainer checkpoints the critic


# ----------------------------------------------------------------------------- resume
@pytest.mark.parametrize(
    "env,extra",
    [
        # native CartPole vector env: terminations, env RNG draws reset states
        ("cartpole", ["algo.n_envs=4", "algo.n_steps=32"]),
        # Sync vector env: a 200-step time limit cut mid-batch (truncation bootstrapping), plus the
        # streaming reward scaler and the running observation normaliser
        ("pendulum", ["algo.n_envs=2", "algo.n_steps=96", "algo.batch_size=64",
                      "algo.normalize_reward=true", "policy.normalize_obs=true", "algo.epochs=2"]),
    ],
)
def test_ppo_resume_is_exact(train, read_metrics, load_checkpoint, tmp_path: Path, env: str, extra: list[str]) -> None:
    per_update = 128 if env == "cartpole" else 192
    # Schedules decay over total_steps, which the interrupted run sets lower: keep them constant.
    common = [f"env={env}", "algo=ppo", "log.tensorboard=false", "checkpoint.every=1", "eval.every_steps=0",
              "eval.episodes=2", "algo.lr_schedule=constant", "algo.clip_schedule=constant", *extra]
    full, part = tmp_path / "full", tmp_path / "part"
    train(full, *common, f"total_steps={4 * per_update}")
    train(part, *common, f"total_steps={2 * per_update}")
    train(part, f"resume={part}", f"total_steps={4 * per_update}")
    a, b = load_checkpoint(full), load_checkpoint(part)
    for name in ("policy", "value"):
        for key, value in a["modules"][name].items():
            torch.testing.assert_close(b["modules"][name][key], value, rtol=0, atol=0, msg=f"{name}.{key}")
    ma = [r for r in read_metrics(full) if "train/loss" in r]
    mb = [r for r in read_metrics(part) if "train/loss" in r]
    assert [r["step"] for r in ma] == [r["step"] for r in mb]
    for ra, rb in zip(ma, mb):
        for key in ("train/loss", "train/loss_value", "train/approx_kl", "rollout/episodes_finished"):
            assert ra[key] == rb[key], (key, ra["step"])
