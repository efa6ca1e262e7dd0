"""Proof from outside (issue 24 item 7): tests/outside_pkg is a user's package, found on the path
like any installed one, that adds a loss (CISPO), an aggregation and an env family with its own
batched vector env (``chain``, ``grpo_marl_outside/chain.py``) through entry points; the CLI,
``fit()``, evaluation and ``load().act()`` work with them without any edit to grpo_marl.
docs/ARCHITECTURE.md's "How to add a loss / an aggregation / an env family" recipes are these steps."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import ROOT, _subprocess_env
from tests.torch_envs import numpy_records

OUTSIDE = Path(__file__).parent / "outside_pkg"
TINY = ["env=cartpole", "total_steps=2000", "algo.num_groups=2", "algo.group_size=4", "eval.episodes=2"]


def _env(*extra_paths: Path) -> dict[str, str]:
    env = _subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_paths), str(OUTSIDE), env["PYTHONPATH"]])
    return env


def _train(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    run_dir = tmp_path / "run"
    args = [*TINY, *overrides, f"hydra.run.dir={run_dir}", "log.progress=false"]
    return subprocess.run(
        [sys.executable, "-m", "grpo_marl.train", *args],
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
    )


def _outside(module: str = "grpo_marl_outside") -> Any:
    """A module of the outside package, imported in this process (nothing gets registered: its
    registrations run only when grpo_marl loads the entry points, in the subprocesses below)."""
    sys.path.insert(0, str(OUTSIDE))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(OUTSIDE))


def test_cispo_objective_is_the_clipped_is_weighted_reinforce() -> None:
    CISPOLoss = _outside().CISPOLoss
    loss = CISPOLoss(clip_eps_low=0.2, clip_eps_high=0.2)
    logp = torch.tensor([0.5, -1.0], requires_grad=True)
    old = torch.tensor([0.0, -1.0])
    adv, w = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.5])
    out = loss(logp, old, adv, w)
    out["loss"].backward()
    # token 0: r = e^0.5 > 1.2, weight clipped to 1.2; token 1: r = 1 -> weight 1
    assert out["loss_policy"].item() == pytest.approx(-(0.5 * 1.2 * 1.0 * 0.5 + 0.5 * 1.0 * -2.0 * -1.0))
    # the clipped token keeps its gradient (CISPO's point): d/dlogp = -w * weight * A
    assert logp.grad.tolist() == pytest.approx([-0.5 * 1.2 * 1.0, -0.5 * 1.0 * -2.0])


def test_cli_trains_with_the_outside_loss_and_aggregation(tmp_path: Path) -> None:
    proc = _train(tmp_path, "algo.loss=cispo", "algo.aggregation=row_mean")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    resolved = (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert "loss: cispo" in resolved and "aggregation: row_mean" in resolved


def test_unregistered_loss_is_refused_naming_the_registered_ones(tmp_path: Path) -> None:
    proc = _train(tmp_path, "algo.loss=cispo", env=_subprocess_env())  # the package not on the path
    assert proc.returncode == 2
    assert "cispo" in proc.stderr and "gspo" in proc.stderr


def test_a_broken_plugin_does_not_break_a_run_that_does_not_use_it(tmp_path: Path) -> None:
    broken = tmp_path / "site"
    (broken / "broken_plugin-0.1.dist-info").mkdir(parents=True)
    (broken / "broken_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: broken_plugin\nVersion: 0.1\n"
    )
    (broken / "broken_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[grpo_marl.losses]\nbroken = no_such_module_xyz:Loss\n"
    )
    proc = _train(tmp_path, "algo.loss=cispo", env=_env(broken))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'broken'" in proc.stderr and "no_such_module_xyz" in proc.stderr  # named in a warning
    asked = _train(tmp_path / "b", "algo.loss=broken", env=_env(broken))
    assert asked.returncode == 2
    assert "no_such_module_xyz" in asked.stderr  # the error names why the plugin is missing


def test_the_outside_group_mode_arranges_half_groups() -> None:
    from grpo_marl.groups import AgentGroups
    from grpo_marl.vec.ports.classic import CartPoleVec

    halves = _outside().HALVES
    ids = halves.arrange(2, 4, AgentGroups.from_layout(CartPoleVec(8).layout))
    assert ids.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert halves.streams and not halves.snapshots


def test_cli_trains_with_the_outside_group_mode(tmp_path: Path) -> None:
    """``algo.group_mode=halves`` comes from an entry point: accepted by the config check (the
    Gymnasium family offers what it declares) and played by the episode collector in its layout."""
    proc = _train(tmp_path, "algo.group_mode=halves", "log.tensorboard=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"
    refused = _train(tmp_path / "refused", "algo.group_mode=halves", env=_subprocess_env())
    assert refused.returncode == 2
    assert "algo.group_mode=halves is not valid; choose one of seed, state, agent, seed_agent" in refused.stderr


def test_fit_trains_with_the_outside_loss(tmp_path: Path) -> None:
    code = (
        "import grpo_marl, json, sys; "
        f"r = grpo_marl.fit('cartpole', run_dir={str(tmp_path / 'fit')!r}, total_steps=2000, "
        "algo={'num_groups': 2, 'group_size': 4, 'loss': 'cispo', 'aggregation': 'row_mean'}, "
        "eval={'episodes': 2}, log={'progress': False}); print(json.dumps(r.summary['status']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == '"completed"'


# -- an env family from outside: grpo_marl_outside/chain.py ---------------------------------------
CHAIN = ["env=chain_reach", "total_steps=10000", "seed=1", "log.progress=false"]


def _random_return(episodes: int = 2000) -> float:
    """The mean return of the uniformly random policy on ``chain_reach`` (about -0.27)."""
    chain = _outside("grpo_marl_outside.chain")
    vec = chain.ChainVec(chain.chain(), episodes)
    step, total = vec.reset(list(range(episodes))), np.zeros(episodes)
    rng = np.random.default_rng(0)
    while not step.env_done.all():
        step = vec.step(torch.from_numpy(rng.integers(0, 3, (episodes, 1))))
        total += step.rewards[:, 0].numpy()
    return float(total.mean())


def _optimal_actions(obs: np.ndarray) -> np.ndarray:
    """Move towards the goal: obs is ``[position, goal]``; 0 left, 2 right."""
    return np.where(obs[..., 1] > obs[..., 0], 2, 0)


def test_chain_vec_keeps_the_vector_env_contract() -> None:
    chain = _outside("grpo_marl_outside.chain")
    raw = chain.ChainVec(chain.chain(slip=0.3), 6)
    record = raw.reset(list(range(6)))  # the tensor contract: CPU tensors of the contract dtypes
    assert record.obs.dtype == torch.float32 and record.env_done.dtype == torch.bool and raw.backend == "numpy"
    assert raw.step(torch.ones((6, 1), dtype=torch.long)).rewards.dtype == torch.float32
    vec = numpy_records(raw)  # the checks below read the records as numpy
    first = vec.reset([7, 7, 7, 8, 9, None])
    assert first.obs.shape == (6, 1, 2) and first.obs.dtype == np.float32 and first.alive.all()
    assert (first.obs[0] == first.obs[1]).all() and (first.obs[1] == first.obs[2]).all()  # seed groups
    assert not (first.obs[:, 0, 0] == first.obs[:, 0, 1]).any()  # never starts on the goal
    again = vec.reset([8], indices=[0])  # a subset reset, rows in ``indices`` order
    assert again.obs.shape == (1, 1, 2) and (again.obs[0] == first.obs[3]).all()
    step = vec.reset([7, 7, 7, 8, 9, 10])
    snaps, state = vec.snapshot(range(6)), vec.get_state()
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 3, (6, 1)) for _ in range(vec.max_episode_steps)]
    trajectory, ended = [], np.full(6, -1)
    for t, a in enumerate(actions):
        before = step
        step = vec.step(a)
        trajectory.append(step)
        finished = before.env_done  # no automatic reset: a finished env is not stepped again
        assert (step.obs[finished] == before.obs[finished]).all() and (step.rewards[finished] == 0).all()
        assert not step.alive[finished].any() and not (step.terminated | step.truncated)[finished].any()
        ended[step.env_done & ~finished] = t
    assert step.env_done.all() and (ended >= 0).all()  # every episode ends within the horizon
    for e, t in enumerate(ended.tolist()):  # an episode ends by reaching the goal or by the time limit
        assert trajectory[t].terminated[e, 0] or (trajectory[t].truncated[e, 0] and t + 1 == vec.max_episode_steps)
    vec.restore(range(6), snaps)  # a snapshot carries the slips' random stream: the same future
    for a, expected in zip(actions, trajectory, strict=True):
        again = vec.step(a)
        assert (again.obs == expected.obs).all() and (again.rewards == expected.rewards).all()
        assert (again.env_done == expected.env_done).all()
    vec.set_state(state)
    assert (vec.step(actions[0]).obs == trajectory[0].obs).all()
    vec.set_state(state)
    with pytest.raises(chain.EnvError, match="vector env 1 .*seed 7"):
        vec.step(np.array([[0], [5], [0], [0], [0], [0]]))


def test_the_family_and_its_envs_come_from_entry_points(tmp_path: Path) -> None:
    code = (
        "from grpo_marl.families import get_family; from grpo_marl.registry import get_spec, list_envs; "
        "from grpo_marl.vec import make_vec_env; s = get_spec('chain_reach'); f = get_family(s.kind); "
        "v = make_vec_env(s, 4, {'length': 5}); "
        "print(s.kind, type(f).__name__, type(v).__name__, v.params.length, 'chain_reach_long' in list_envs())"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["chain", "ChainFamily", "ChainVec", "5", "True"]
    # the family's rules reach the config checks: no per-env objects to step one by one
    sync = _train(tmp_path, "env=chain_reach", "vec.vectorization=sync")
    assert sync.returncode == 2 and not (tmp_path / "run").exists()
    assert "vec.vectorization=sync" in sync.stderr and "supports auto, native" in sync.stderr


@pytest.fixture(scope="module")
def chain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m grpo_marl.train env=chain_reach``: the outside family's env trained from the CLI."""
    run_dir = tmp_path_factory.mktemp("chain") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_marl.train", *CHAIN, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_cli_trains_the_outside_family_env(chain_run: Path) -> None:
    summary = json.loads((chain_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env"] == "chain_reach"
    records = [json.loads(line) for line in (chain_run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "rollout/steps" in r]
    assert summary["env_steps"] >= 10000 and summary["env_steps"] == sum(r["rollout/steps"] for r in train)
    assert "env_kind: chain" in (chain_run / "config.yaml").read_text()
    # the learning signal is real: the greedy policy walks to the goal (optimal mean ~0.83)
    assert summary["eval/episodes"] == 32  # the env's tuned defaults applied
    assert summary["eval/return_mean"] > _random_return() + 0.8
    assert summary["steps_to_threshold"] is not None  # the registered threshold (0.75) was crossed
    assert train[0]["rollout/return_mean"] < summary["eval/return_mean"]


def test_evaluate_and_load_act_with_the_outside_family_policy(chain_run: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_marl.evaluate", f"run={chain_run}", "episodes=16"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((chain_run / "eval.json").read_text())
    assert result["eval/episodes"] == 16 and result["eval/return_mean"] > 0.5
    # every (position, goal) pair of the 9-cell chain, scaled to [-1, 1] as the env observes them
    cells = np.linspace(-1.0, 1.0, 9, dtype=np.float32)
    obs = np.array([[p, g] for p in cells for g in cells if p != g], np.float32)
    code = (
        "import grpo_marl, json, sys, numpy as np; "
        f"p = grpo_marl.load({str(chain_run)!r}); obs = np.array(json.loads(sys.stdin.read()), np.float32); "
        "one = p.act(obs[0]); print(json.dumps({'batch': p.act(obs).tolist(), 'one': int(one), "
        "'shape': list(np.shape(one))}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=_env(),
        input=json.dumps(obs.tolist()),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    actions = np.array(out["batch"])
    assert actions.shape == (len(obs),) and out["shape"] == [] and out["one"] == actions[0]
    assert (actions == _optimal_actions(obs)).mean() >= 0.9  # it moves towards the goal


def test_fit_trains_the_outside_family_env_with_state_groups(tmp_path: Path) -> None:
    """``fit()`` with ``group_mode=state``: groups branch from the family's own env snapshots."""
    run_dir = tmp_path / "fit"
    code = (
        "import grpo_marl, json; "
        f"r = grpo_marl.fit('chain_reach', run_dir={str(run_dir)!r}, total_steps=10000, seed=1, "
        "algo={'group_mode': 'state'}, log={'progress': False}); print(json.dumps(r.summary))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["env_steps"] >= 10000
    assert (run_dir / "summary.json").exists() and (run_dir / "metrics.jsonl").exists()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("rollout/frac_restored_groups", 0.0) for r in records) > 0  # snapshots restored
    assert summary["eval/return_mean"] > _random_return() + 0.5
