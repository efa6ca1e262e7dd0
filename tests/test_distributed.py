"""Data-parallel training under torchrun (gloo, CPU), env-worker failures, and the CUDA paths.

The launches are real ``torchrun --nproc_per_node=2 -m grpo_marl.train`` jobs on tiny configs:
ranks must end with bit-identical weights, only rank 0 may write files, every rank must use rank
0's run directory, and checkpoints must resume at another world size. Every launch has a
wall-clock timeout and a short process-group timeout, so a hang fails in minutes. The batch split
(which config keys each algorithm divides over the ranks) is checked without torchrun. GPU-only
tests skip without CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_marl import distributed as dist
from grpo_marl.collectors import HostToDevice
from grpo_marl.config import ConfigError
from grpo_marl.train import rank_overrides
from tests.conftest import needs

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN_TIMEOUT = 600  # seconds per torchrun launch

# Small but real: CartPole GRPO with 2 groups of 2 per rank, a few updates.
TINY_GRPO = [
    "env=cartpole",
    "algo.num_groups=4",
    "algo.group_size=2",
    "algo.epochs=1",
    "algo.minibatches=2",
    "total_steps=600",
    "eval.episodes=2",
    "checkpoint.every=1",
    "log.tensorboard=false",
]


def torchrun(*overrides: str, cwd: Path, hash_dir: Path | None = None, nproc: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=N -m grpo_marl.train ...`` (gloo on CPU)."""
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = "1"
    env["GRPO_MARL_BACKEND"] = "gloo"
    env["GRPO_MARL_DIST_TIMEOUT"] = "120"  # a rank waiting on a dead peer gives up in minutes
    env.pop("HYDRA_FULL_ERROR", None)
    if hash_dir is not None:
        env[dist.PARAM_HASH_ENV] = str(hash_dir)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "-m", "grpo_marl.train", *overrides, "log.progress=false",
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"


def _hashes(hash_dir: Path, n: int = 2) -> list[dict]:
    records = [json.loads((hash_dir / f"rank{r}.json").read_text()) for r in range(n)]
    assert [r["rank"] for r in records] == list(range(n))
    return records


# -- unit: per-rank config, validation, Hydra overrides ---------------------------------------------
def test_rank_config_splits_the_global_batch(resolve) -> None:
    cfg = resolve(["env=cartpole", "algo.num_groups=8", "algo.group_size=4", "total_steps=1000"])
    assert dist.rank_config(cfg, dist.DistContext()) is cfg  # single process: untouched
    r1 = dist.rank_config(cfg, dist.DistContext(rank=1, world_size=2))
    assert (r1.algo.num_groups, r1.vec.num_envs, r1.total_steps) == (4, 16, 500)
    assert r1.seed == cfg.seed + dist.SEED_STRIDE and r1.algo.group_size == 4
    assert cfg.algo.num_groups == 8  # the global config is not modified

    ppo = resolve(["env=cartpole", "algo=ppo"])
    p1 = dist.rank_config(ppo, dist.DistContext(rank=1, world_size=2))
    assert p1.algo.n_envs == ppo.algo.n_envs // 2 and p1.vec.num_envs == ppo.vec.num_envs // 2
    assert p1.algo.minibatches == ppo.algo.minibatches  # same optimizer steps on every rank


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_rank_config_splits_multi_agent_ppo_envs(resolve, algo: str) -> None:
    """MAPPO/IPPO are PPO: torchrun divides ``algo.n_envs`` (global, as the README promises) across
    the ranks, and each rank's vector env holds its share."""
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.control import ControlTask

    cfg = resolve(["env=simple_spread", f"algo={algo}", "algo.n_envs=8", "algo.n_steps=5", "total_steps=4000"])
    assert {"algo.n_envs", "vec.num_envs"} <= set(dist.split_keys(cfg))
    r1 = dist.rank_config(cfg, dist.DistContext(rank=1, world_size=2))
    assert (r1.algo.n_envs, r1.vec.num_envs, r1.total_steps) == (4, 4, 2000)
    assert r1.seed == cfg.seed + dist.SEED_STRIDE
    assert (r1.algo.n_steps, r1.algo.minibatches) == (cfg.algo.n_steps, cfg.algo.minibatches)
    assert cfg.algo.n_envs == 8  # the global config is not modified
    task = ControlTask(
        r1, get_spec("simple_spread"), torch.device("cpu"), collector="steps", with_state=algo == "mappo"
    )
    try:
        assert task.vec.num_envs == 4 and task.vec.layout.num_agents == 3
        batch = task.collect(task.policy)
        assert batch.mask.shape == (4 * 3, 5)  # (env, agent) rows of this rank's share
    finally:
        task.close()


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_uneven_multi_agent_ppo_split_is_a_config_error(resolve, algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"algo.n_envs=8 does not split over 3 .*multiple of 3"):
        resolve(["env=simple_spread", f"algo={algo}", "algo.n_envs=8"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    resolve(["env=simple_spread", f"algo={algo}", "algo.n_envs=8"])


def test_uneven_split_is_a_config_error(resolve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"algo.num_groups=8 does not split over 3 .*multiple of 3"):
        resolve(["env=cartpole", "algo.num_groups=8"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    resolve(["env=cartpole", "algo.num_groups=8"])


def test_ranks_above_zero_write_nothing_through_hydra() -> None:
    assert rank_overrides(["env=cartpole"], rank=0, world=2) == ([], None)
    assert rank_overrides(["env=cartpole"], rank=0, world=1) == ([], None)
    extra, scratch = rank_overrides(["env=cartpole"], rank=1, world=2)
    try:
        assert "hydra.output_subdir=null" in extra and "hydra/job_logging=none" in extra
        assert scratch is not None and f"hydra.run.dir={scratch}" in extra
    finally:
        os.rmdir(scratch)
    extra, scratch = rank_overrides(["hydra.run.dir=/x"], rank=1, world=2)
    try:  # the user's run dir is kept (rank 1 creates nothing in it); the sweep dir is scratch
        assert not any(e.startswith("hydra.run.dir") for e in extra)
        assert f"hydra.sweep.dir={scratch}" in extra
    finally:
        os.rmdir(scratch)


def test_host_to_device_matches_as_tensor_on_cpu() -> None:
    h2d = HostToDevice("cpu")
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    assert torch.equal(h2d(x), torch.as_tensor(x))


# -- torchrun jobs -----------------------------------------------------------------------------------
def test_torchrun_grpo_identical_ranks_one_run_dir_and_resume_on_one_process(tmp_path: Path, train) -> None:
    """2 ranks, *no* hydra.run.dir: both must train in rank 0's timestamped dir; then resume
    that run in a single process (N 2 -> 1)."""
    work, hashes = tmp_path / "work", tmp_path / "hashes"
    work.mkdir()
    proc = torchrun(*TINY_GRPO, cwd=work, hash_dir=hashes)
    _ok(proc)
    assert sorted(p.name for p in work.iterdir()) == ["runs"]  # nothing else in the cwd
    run_dirs = list((work / "runs" / "cartpole").iterdir())
    assert len(run_dirs) == 1, f"ranks used different run dirs: {run_dirs}"
    run_dir = run_dirs[0]
    # Rank 0's files only: one config, one metrics file, one checkpoint; no rank-1 artifacts.
    names = sorted(p.name for p in run_dir.iterdir())
    # (.lock: the run-directory lock rank 0 held while training, see grpo_marl/rundir.py)
    assert names == [".hydra", ".lock", "checkpoints", "config.yaml", "metrics.jsonl", "summary.json", "train.log"]
    assert (run_dir / "train.log").read_text().count("Error") == 0

    h0, h1 = _hashes(hashes)
    assert h0["param_hash"] == h1["param_hash"], "ranks diverged"
    assert h0["updates"] == h1["updates"] >= 2

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["env_steps"] >= 600
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert ckpt["counters"]["world_size"] == 2 and len(ckpt["ranks"]) == 2
    rng0, rng1 = (r["task"]["collector"]["rng"]["state"]["state"] for r in ckpt["ranks"])
    assert rng0 != rng1, "ranks must draw their own reset seeds"
    # Env steps are summed over ranks, each rank collected its own half.
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] > first["rollout/steps"]  # rollout/steps is a per-rank mean

    resumed = train(run_dir, f"resume={run_dir}", "total_steps=1200")
    assert resumed["world_size"] == 1
    assert resumed["env_steps"] >= 1200 and resumed["updates"] > summary["updates"]


@needs("transformers", "tokenizers", extra="text")
def test_torchrun_text_micro_batches_keep_ranks_identical(tmp_path: Path) -> None:
    """LLM GRPO on 2 ranks with gradient accumulation (``algo.micro_batch_rows``): each rank
    back-propagates its pieces (2 of its 4-rollout minibatches here) without syncing and joins one
    all-reduce per step, so the ranks' weights stay identical."""
    work, hashes = tmp_path / "work", tmp_path / "hashes"
    work.mkdir()
    proc = torchrun(
        "env=arithmetic", "algo.num_groups=4", "algo.group_size=4", "algo.minibatches=2",
        "algo.micro_batch_rows=3", "total_steps=64", "eval.episodes=4", "text.eval_prompts=4",
        "log.tensorboard=false", "model.save=false", f"hydra.run.dir={work / 'run'}",
        cwd=work, hash_dir=hashes,
    )  # fmt: skip
    _ok(proc)
    h0, h1 = _hashes(hashes)
    assert h0["param_hash"] == h1["param_hash"], "ranks diverged"
    assert h0["updates"] == h1["updates"] >= 2


@needs("transformers", "tokenizers", extra="text")
@pytest.mark.parametrize("branch_train", [False, True])
def test_torchrun_text_state_groups_keep_ranks_identical(tmp_path: Path, branch_train: bool) -> None:
    """Text state groups on 2 ranks: each rank branches its own completions (a different number
    of continuations per rank), the env steps add them up, and the ranks' weights stay identical,
    with the continuations as value estimates only and trained on (``text.branch_train``)."""
    work, hashes = tmp_path / "work", tmp_path / "hashes"
    work.mkdir()
    proc = torchrun(
        "env=arithmetic", "algo.group_mode=state", "text.branch_size=2", "algo.num_groups=4", "algo.group_size=4",
        f"text.branch_train={branch_train}", "algo.minibatches=2", "algo.zero_std=keep", "total_steps=160", "eval.episodes=4", "text.eval_prompts=4",
        "log.tensorboard=false", "model.save=false", f"hydra.run.dir={work / 'run'}",
        cwd=work, hash_dir=hashes,
    )  # fmt: skip
    _ok(proc)
    h0, h1 = _hashes(hashes)
    assert h0["param_hash"] == h1["param_hash"], "ranks diverged"
    assert h0["updates"] == h1["updates"] >= 2
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["env_steps"] > 32 * summary["updates"]  # branches counted


def test_torchrun_ppo_resumes_a_single_process_run_on_two_ranks(tmp_path: Path, train) -> None:
    """PPO (value net in DDP too): a 1-process run continued on 2 ranks (N 1 -> 2)."""
    run_dir, hashes = tmp_path / "ppo", tmp_path / "hashes"
    ppo = [
        "env=cartpole", "algo=ppo", "algo.n_envs=4", "algo.n_steps=32", "algo.batch_size=32",
        "algo.epochs=2", "total_steps=256", "eval.episodes=2", "log.tensorboard=false",
    ]  # fmt: skip
    first = train(run_dir, *ppo)
    assert first["world_size"] == 1 and first["env_steps"] == 256
    proc = torchrun(f"resume={run_dir}", "total_steps=768", f"hydra.run.dir={run_dir}", cwd=tmp_path, hash_dir=hashes)
    _ok(proc)
    h0, h1 = _hashes(hashes)
    assert h0["param_hash"] == h1["param_hash"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["env_steps"] == 768
    assert summary["updates"] == 6  # 2 single-process + 4 two-rank updates of 128 global steps


def test_env_worker_crash_names_env_and_seed_and_keeps_checkpoint(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "crash"
    proc = run_cli(
        "env=tests.failing_envs:crash_after", "vec.vectorization=async", "algo.num_groups=2",
        "algo.group_size=2", "checkpoint.every=1", "total_steps=100000", "log.tensorboard=false",
        run_dir=run_dir, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "env 'tests.failing_envs:crash_after' failed during step (vector index" in proc.stderr
    assert "reset seed" in proc.stderr and "EnvCrash" in proc.stderr
    assert "Traceback" not in proc.stderr
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert ckpt["counters"]["updates"] >= 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "EnvCrash" in summary["error"]


def test_multi_agent_env_worker_crash_stops_the_run_cleanly(run_cli, tmp_path: Path) -> None:
    """A PettingZoo env raising inside a worker process (``vec.vectorization=async``) is the same
    clean stop as a Gymnasium one: exit 1, ``summary.json`` says ``failed`` and names the env, the
    vector index and the episode's reset seed, and the last checkpoint is kept."""
    run_dir = tmp_path / "crash_marl"
    proc = run_cli(
        "env=tests.failing_envs:crash_marl", "vec.vectorization=async", "algo.num_groups=2",
        "algo.group_size=2", "checkpoint.every=1", "total_steps=100000", "log.tensorboard=false",
        "eval.every_steps=0", run_dir=run_dir, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    error = summary["error"]
    assert "env 'tests.failing_envs:crash_marl' failed during step" in error and "EnvCrash" in error
    index = int(error.split("vector index ")[1].split(",")[0])
    seed = int(error.split("reset seed ")[1].split(")")[0])
    assert 0 <= index < 4 and seed >= 0
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert ckpt["counters"]["updates"] >= 1  # 30 healthy steps per env: a few 10-step updates
    assert summary["env_steps"] >= ckpt["counters"]["env_steps"]


def test_torchrun_one_rank_crashing_stops_all_ranks_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = torchrun(
        "env=tests.failing_envs:crash_after", "+env_kwargs.rank=1", "vec.vectorization=async",
        "algo.num_groups=4", "algo.group_size=2", "checkpoint.every=1", "total_steps=100000",
        "log.tensorboard=false", f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0
    summary = json.loads((run_dir / "summary.json").read_text())  # written by rank 0
    assert summary["status"] == "failed"
    assert "rank 1" in summary["error"] and "tests.failing_envs:crash_after" in summary["error"]
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert ckpt["counters"]["updates"] >= 1


# -- CUDA (skipped without a GPU) ----------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_host_to_device_pinned_copy_on_cuda() -> None:
    h2d = HostToDevice("cuda")
    for seed in range(3):  # the pinned buffer is reused: earlier results must not change
        x = np.random.default_rng(seed).normal(size=(64, 4)).astype(np.float32)
        out = h2d(x)
        assert out.is_cuda and torch.equal(out.cpu(), torch.as_tensor(x))


@cuda
def test_cuda_training_run_keeps_policy_and_storage_on_the_gpu(train, tmp_path: Path) -> None:
    summary = train(tmp_path / "gpu", *TINY_GRPO, "device=cuda")
    assert summary["env_steps"] >= 600
    ckpt = torch.load(tmp_path / "gpu" / "checkpoints" / "last.pt", weights_only=False)
    assert all(t.is_cuda for t in ckpt["modules"]["policy"].values())


@cuda
def test_cuda_bf16_autocast_text_run(train, tmp_path: Path) -> None:
    summary = train(
        tmp_path / "text", "env=arithmetic", "device=cuda", "autocast=bf16", "model.dtype=float32",
        "algo.num_groups=4", "algo.group_size=4", "total_steps=64", "eval.episodes=4",
        "text.eval_prompts=8", "log.tensorboard=false", "model.save=false",
    )  # fmt: skip
    assert summary["env_steps"] >= 64
