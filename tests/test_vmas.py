"""The ``vmas`` env family (envs/vmas/): VMAS's batched torch envs under the vector-env contract.

Snapshot/restore exactness per scenario, seeded resets, frozen done envs, a few-update training
run per action type and group mode, the missing-extra message, and ``load().act`` on
VMAS-shaped (batched, torch) observations.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

vmas = pytest.importorskip("vmas", reason="the vmas extra: pip install -e '.[vmas]'")

import grpo_marl  # noqa: E402
from envs.vmas import BENCHMARL_TASKS, make_task  # noqa: E402
from envs.vmas.vec import VmasVec  # noqa: E402
from grpo_marl.errors import UnknownEnvError, UserInputError  # noqa: E402
from grpo_marl.registry import get_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: scenarios whose transitions are deterministic given the actions (the rest draw noise inside a
#: step for the whole batch: football's AI opponents; ball_trajectory and road_traffic keep
#: per-env state VMAS draws at random)
EXACT = [
    "balance", "navigation", "sampling", "transport", "wheel", "dispersion", "give_way", "passage",
    "reverse_transport", "flocking", "discovery", "dropout", "buzz_wire", "joint_passage", "ball_passage",
    "multi_give_way", "wind_flocking", "simple_spread", "simple_tag", "simple_world_comm",
]  # fmt: skip
# (simple_reference draws its goal landmark once for the whole batch at a full reset, an object
# reference rather than a row: in-batch copies are exact, restores into another instance are not)


def _vec(scenario: str, num_envs: int, **kwargs: object) -> VmasVec:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return VmasVec(make_task(scenario, max_steps=kwargs.pop("max_steps", 40), **kwargs), num_envs)


def _actions(vec: VmasVec, g: torch.Generator) -> torch.Tensor:
    E, A = vec.num_envs, vec.layout.num_agents
    if vec.layout.continuous:
        return torch.rand((E, A, max(vec.layout.action_dims)), generator=g) * 2 - 1
    return torch.randint(0, max(vec.layout.n_actions), (E, A), generator=g)


@pytest.mark.parametrize("scenario", EXACT)
def test_a_restored_env_continues_exactly_like_the_original(scenario: str) -> None:
    vec = _vec(scenario, 5)
    vec.reset([11, 12, 13, 14, 15])
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        vec.step(_actions(vec, g))
    snap = vec.snapshot([2])
    vec.step(_actions(vec, g))  # the original moves on; its snapshot must not
    vec.restore([0, 4], [snap[0], snap[0]])
    clone = _vec(scenario, 5)
    clone.reset([1, 2, 3, 4, 5])
    clone.restore([1], snap)
    g = torch.Generator().manual_seed(1)
    for _ in range(12):
        a = _actions(vec, g)
        a[4] = a[0]
        b = torch.zeros_like(a)
        b[1] = a[0]
        s, c = vec.step(a), clone.step(b)
        for x in (s.obs, s.rewards, s.env_done):
            torch.testing.assert_close(x[4], x[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(c.obs[1], s.obs[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(c.rewards[1], s.rewards[0], rtol=0, atol=1e-6)


def test_seeded_resets_share_starts_within_a_call_and_repeat_across_envs() -> None:
    a, b = _vec("balance", 6), _vec("balance", 6)
    before = torch.get_rng_state()
    ra = a.reset([3, 3, 5, 7, 3, 9])
    assert torch.equal(torch.get_rng_state(), before)  # the training's stream is not touched
    torch.testing.assert_close(ra.obs[0], ra.obs[1])
    torch.testing.assert_close(ra.obs[0], ra.obs[4])
    assert not torch.allclose(ra.obs[0], ra.obs[2])
    torch.testing.assert_close(b.reset([3, 3, 5, 7, 3, 9]).obs, ra.obs)  # same seeds, same rows: same starts
    # a subset reset leaves the other envs where they were
    g = torch.Generator().manual_seed(0)
    s = a.step(_actions(a, g))
    r = a.reset([42], indices=[3])
    assert r.obs.shape == (1, a.layout.num_agents, a.layout.obs_shape[0])
    torch.testing.assert_close(a.observations([0, 1, 2, 4, 5]).obs, s.obs[[0, 1, 2, 4, 5]])
    assert a.observations([3]).alive.all()


def test_a_done_env_keeps_its_final_observation_until_reset() -> None:
    vec = _vec("transport", 3, max_steps=5)
    vec.reset([1, 2, 3])
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        s = vec.step(_actions(vec, g))
    assert s.truncated.all() and s.env_done.all() and not s.alive.any()
    final = s.obs.clone()
    after = vec.step(_actions(vec, g))
    torch.testing.assert_close(after.obs, final)
    assert (after.rewards == 0).all() and not after.truncated.any()
    assert vec.reset([4], indices=[1]).alive.all()


def test_the_record_is_torch_on_the_env_device_with_the_layout_shapes() -> None:
    vec = _vec("navigation", 4)
    s = vec.reset([0, 1, 2, 3])
    assert vec.backend == "torch" and s.obs.device == vec.device
    A, D = vec.layout.num_agents, vec.layout.obs_shape[0]
    assert s.obs.shape == (4, A, D) and s.obs.dtype == torch.float32
    s = vec.step(vec.layout.action_array(4))
    assert s.rewards.shape == (4, A) and s.terminated.dtype == torch.bool and s.env_done.shape == (4,)


def test_discrete_actions_and_heterogeneous_observations() -> None:
    vec = _vec("simple_adversary", 3, continuous_actions=False)
    assert not vec.layout.continuous and set(vec.layout.n_actions) == {9}  # VMAS MPE: 9 moves
    assert len(set(vec.layout.obs_dims)) > 1  # adversary and agents see different things: padded
    s = vec.reset([0, 1, 2])
    s = vec.step(torch.randint(0, 9, (3, vec.layout.num_agents)))
    assert s.obs.shape[-1] == max(vec.layout.obs_dims)


def test_names_defaults_and_refusals() -> None:
    assert {"balance", "navigation", "sampling", "transport", "wheel"} <= set(BENCHMARL_TASKS)
    spec = get_spec("balance")
    assert spec.kind == "vmas"
    assert spec.defaults["common"]["env_kwargs"] == {
        "continuous_actions": True, "max_steps": 100, "n_agents": 4, "random_package_pos_on_line": True,
        "package_mass": 5,
    }  # fmt: skip
    assert get_spec("vmas:balance").defaults == spec.defaults
    assert get_spec("vmas:simple_spread").kind == "vmas" and get_spec("simple_spread").kind == "pettingzoo"
    with pytest.raises(UnknownEnvError, match=r"did you mean vmas:balance"):
        get_spec("vmas:balanse")
    with pytest.raises(UserInputError, match=r"not used by the scenario.*env_kwargs"):
        _vec("balance", 2, n_agentz=3)


def test_training_runs_per_action_type_and_group_mode(tmp_path: Path) -> None:
    small = {"total_steps": 1200, "eval": {"episodes": 4, "every_steps": 0}, "checkpoint": {"every": 0}}
    small["algo"] = {"num_groups": 2, "group_size": 3}
    runs = [
        ("balance", {"env_kwargs": {"max_steps": 20}}),
        ("balance", {"env_kwargs": {"max_steps": 20, "continuous_actions": False}}),
        ("balance", {"env_kwargs": {"max_steps": 20}, "algo": {**small["algo"], "group_mode": "state"}}),
        ("vmas:navigation", {"env_kwargs": {"max_steps": 20, "shared_rew": False}, "algo": {"group_mode": "agent"}}),
    ]
    for i, (env, extra) in enumerate(runs):
        cfg = {**small, **extra, "algo": {**small["algo"], **extra.get("algo", {})}}
        result = grpo_marl.fit(env, seed=1, run_dir=tmp_path / f"r{i}", **cfg)
        assert result.summary["status"] == "completed"
        assert result.summary["env_steps"] >= 1200
        lines = [json.loads(x) for x in (tmp_path / f"r{i}" / "metrics.jsonl").read_text().splitlines()]
        assert any("train/loss" in x and "train/grad_norm" in x for x in lines)  # it updated
    mappo = grpo_marl.fit(
        "wheel", algo="mappo", seed=1, run_dir=tmp_path / "mappo", total_steps=1000,
        env_kwargs={"max_steps": 20}, eval={"episodes": 2, "every_steps": 0}, checkpoint={"every": 0},
        algo__n_envs=10, algo__n_steps=20,
    )  # fmt: skip
    assert mappo.summary["status"] == "completed"


def test_load_acts_on_vmas_shaped_observations(tmp_path: Path) -> None:
    run = tmp_path / "run"
    grpo_marl.fit(
        "balance", seed=2, run_dir=run, total_steps=600, env_kwargs={"max_steps": 20},
        algo={"num_groups": 2, "group_size": 3}, eval={"episodes": 2, "every_steps": 0},
    )  # fmt: skip
    policy = grpo_marl.load(run)
    env = vmas.make_env("balance", num_envs=5, device="cpu", continuous_actions=True, n_agents=4, max_steps=20,
                        random_package_pos_on_line=True, package_mass=5)  # fmt: skip
    obs = env.reset()
    actions = policy.act({a.name: o for a, o in zip(env.agents, obs, strict=True)})
    assert set(actions) == {a.name for a in env.agents}
    assert all(actions[a.name].shape == (5, 2) for a in env.agents)
    env.step([torch.as_tensor(actions[a.name]) for a in env.agents])
    one = policy.act({a.name: o[0] for a, o in zip(env.agents, obs, strict=True)})
    assert one["agent_0"].shape == (2,)
    with pytest.raises(UserInputError, match=r"expects shape"):
        policy.act({"agent_0": obs[0][:, :3]})


def test_missing_vmas_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    # a Python where vmas cannot be imported: the run stops before anything is built
    code = (
        "import sys; sys.modules['vmas'] = None\n"
        "from grpo_marl.train import main; sys.argv = ['train', 'env=balance', 'hydra.run.dir="
        + str(tmp_path / "run")
        + "']\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'grpo_marl[vmas]'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
