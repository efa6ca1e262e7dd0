"""Image observations and the butterfly/sisl families (issue 13): the CNN encoder, uint8 from the
vector env to the batch, SuperSuit preprocessing from the config, replay snapshots, the memory
check and the missing-extra message. Short CLI runs go through subprocesses with timeouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from grpo_marl.errors import UnsupportedSpaceError, UserInputError
from grpo_marl.policies.cnn import NatureCNN, resolve_encoder
from tests.conftest import needs, require

#: the butterfly families (cooperative_pong) and SuperSuit preprocessing: the marl-extra extra.
#: The encoder tests and the missing-extra message need neither.
marl_extra = needs("supersuit", "pygame", extra="marl-extra")

ROOT = Path(__file__).resolve().parents[1]
PONG_SMALL = [
    "env=cooperative_pong",
    "env_preprocess.resize=[40,40]",
    "env_preprocess.frame_stack=2",
    "+env_kwargs.max_cycles=60",
]


def _run(args: list[str], timeout: int = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )


# -- encoder -------------------------------------------------------------------------------------


def test_cnn_shapes_and_uint8_input() -> None:
    enc = NatureCNN((48, 48, 4))
    x = torch.randint(0, 256, (3, 5, 48, 48, 4), dtype=torch.uint8)
    out = enc(x)
    assert out.shape == (3, 5, 512) and out.dtype == torch.float32
    assert x.dtype == torch.uint8  # scaling happens on a float copy inside the encoder
    with pytest.raises(UnsupportedSpaceError, match="too small"):
        NatureCNN((20, 20, 1))


def test_encoder_setting() -> None:
    assert resolve_encoder("auto", True) == "cnn"
    assert resolve_encoder("auto", False) == "mlp"
    assert resolve_encoder("mlp", True) == "mlp"
    with pytest.raises(UserInputError, match="policy.encoder=cnn"):
        resolve_encoder("cnn", False)


def _build(overrides: list[str]):
    """A cooperative_pong ControlTask from the base config, its tuned preprocessing and overrides."""
    import envs.multiagent  # noqa: F401
    from grpo_marl.algos import ALGOS, _load_builtin_algos
    from grpo_marl.registry import get_spec
    from grpo_marl.settings import reference
    from grpo_marl.tasks import make_task

    cfg = reference("grpo")  # every key at its default
    spec = get_spec("cooperative_pong")
    tuned = spec.defaults["common"]
    cfg = OmegaConf.merge(cfg, {"env_preprocess": tuned["env_preprocess"]}, OmegaConf.from_dotlist(overrides))
    _load_builtin_algos()
    return cfg, make_task(cfg, spec, torch.device("cpu"), collector=ALGOS["grpo"].collector)


@marl_extra
def test_preprocess_config_and_uint8_through_storage() -> None:
    cfg, task = _build(
        [
            "env=cooperative_pong",
            "env_preprocess.resize=[40,36]",
            "env_preprocess.frame_stack=3",
            "algo.group_size=2",
            "algo.num_groups=1",
            "env_kwargs.max_cycles=30",
        ]
    )
    try:
        lay = task.vec.layout
        assert lay.obs_shape == (36, 40, 3) and lay.obs_dtype == np.uint8 and lay.is_image
        assert task.policy._cnn
        step = task.vec.reset([1, 1])
        assert step.obs.dtype == np.uint8 and step.obs.shape == (2, 2, 36, 40, 3)
        batch = task.collect(task.policy)
        assert batch["obs"].dtype == torch.uint8 and batch["obs"].shape[-3:] == (36, 40, 3)
        assert task.collector._storage.obs.dtype == torch.uint8
        logp, ent = task.log_prob(task.policy, {k: batch[k][batch.mask] for k in ("obs", "actions", "agent")})
        assert torch.isfinite(logp).all() and ent is not None
        assert task.storage["storage"] > 0
    finally:
        task.close()


@marl_extra
def test_downsampled_state_and_replay_snapshot() -> None:
    import envs.multiagent  # noqa: F401
    from grpo_marl.marl import preprocess
    from grpo_marl.registry import get_spec
    from grpo_marl.vec.snapshot import restore_env, snapshot_env

    spec = get_spec("cooperative_pong")
    settings = preprocess.settings_of({"color_reduction": "full", "resize": [40, 40], "state_resize": [21, 14]})
    env = preprocess.wrap_factory(spec.factory, settings, "cooperative_pong")()
    obs, _ = env.reset(seed=5)
    assert obs["paddle_0"].shape == (40, 40, 1) and obs["paddle_0"].dtype == np.uint8
    state = env.state()
    assert state.shape == (21 * 14,) and state.dtype == np.float32 and 0.0 <= state.min() <= state.max() <= 1.0
    assert vars(env.unwrapped).get("max_cycles") == 900  # exposed for the driver
    for _ in range(5):
        env.step({a: 1 for a in env.agents})
    snap = snapshot_env(env)
    first = [env.step({a: 2 for a in env.agents})[0]["paddle_0"] for _ in range(4)]
    env = restore_env(env, snap)
    again = [env.step({a: 2 for a in env.agents})[0]["paddle_0"] for _ in range(4)]
    assert all(np.array_equal(x, y) for x, y in zip(first, again))
    with pytest.raises(UserInputError, match="env_preprocess.frame_stack"):
        preprocess.settings_of({"frame_stack": 0})


@marl_extra
@pytest.mark.parametrize("stack", [1, 3])
def test_preprocessing_on_the_aec_env_equals_wrapping_the_parallel_env(stack: int) -> None:
    """The per-frame SuperSuit wrappers go on the AEC env inside ``aec_to_parallel`` and one lean
    conversion follows (``preprocess.apply``): observations, rewards, ends and infos equal
    SuperSuit's wrappers on PettingZoo's Parallel env step for step, over episode ends, while the
    raw env renders each agent's observation once per joint step instead of once per wrapper
    layer plus the observation ``aec_to_parallel`` reads and discards before each action."""
    import supersuit as ss
    from pettingzoo.butterfly import cooperative_pong_v6
    from pettingzoo.utils.conversions import aec_to_parallel

    from grpo_marl.marl import preprocess

    def reference() -> object:
        env = aec_to_parallel(cooperative_pong_v6.env(max_cycles=40))
        env = ss.dtype_v0(ss.resize_v1(ss.color_reduction_v0(env, "full"), 40, 36, linear_interp=True), np.uint8)
        return ss.frame_stack_v1(env, stack) if stack > 1 else ss.reshape_v0(env, (36, 40, 1))

    ours = preprocess.apply(
        aec_to_parallel(cooperative_pong_v6.env(max_cycles=40)),
        {"color_reduction": "full", "resize": [40, 36], "frame_stack": stack},
    )
    theirs = reference()
    raw = ours.unwrapped
    calls = {"n": 0}
    observe = raw.observe

    def counting(agent: str) -> object:
        calls["n"] += 1
        return observe(agent)

    raw.observe = counting
    rng = np.random.default_rng(0)
    steps = 0
    for episode in range(3):
        a, _ = ours.reset(seed=episode)
        b, _ = theirs.reset(seed=episode)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        assert a["paddle_0"].shape == (36, 40, stack) and a["paddle_0"].dtype == np.uint8
        while ours.agents:
            actions = {agent: int(rng.integers(3)) for agent in ours.agents}
            calls["n"] = 0
            got, want = ours.step(actions), theirs.step(actions)
            assert calls["n"] == len(actions)  # one render per agent (PettingZoo's own: two)
            steps += 1
            for x, y in zip(got, want):
                assert x.keys() == y.keys()
                for k in x:
                    assert np.array_equal(np.asarray(x[k]), np.asarray(y[k]))
        assert not theirs.agents
    assert steps >= 40  # at least one episode ran to its cycle limit or a miss


@marl_extra
@pytest.mark.parametrize("name", ["knights_archers_zombies", "multiwalker", "pistonball"])
def test_lean_conversion_equals_pettingzoos_parallel_env(name: str) -> None:
    """Without preprocessing the vector path still converts with :class:`ParallelFromAEC`; for the
    vector-observation, continuous-action and 20-agent envs it steps exactly as PettingZoo's own
    Parallel env (observations, rewards, ends, infos) over two seeded episodes."""
    require("pymunk", *(["Box2D"] if name == "multiwalker" else []), extra="marl-extra")
    from benchmarks.marl_extra import random_joint_action
    from grpo_marl.marl import preprocess
    from grpo_marl.marl.envs import make_parallel_env

    kwargs = {"max_cycles": 30}
    ours = preprocess.apply(make_parallel_env(name, **kwargs), {})
    theirs = make_parallel_env(name, **kwargs)
    chain, env = [], ours
    while env is not None:
        chain.append(type(env).__name__)
        env = vars(env).get("env")  # wrappers forward attribute lookups: read the instance's own
    assert "ParallelFromAEC" in chain, chain
    rng = np.random.default_rng(1)
    for episode in range(2):
        a, _ = ours.reset(seed=10 + episode)
        b, _ = theirs.reset(seed=10 + episode)
        assert all(np.array_equal(a[k], b[k]) for k in b)
        while theirs.agents:
            actions = random_joint_action(theirs, rng)
            for x, y in zip(ours.step(actions), theirs.step(actions)):
                assert x.keys() == y.keys()
                for k in x:
                    assert np.array_equal(np.asarray(x[k]), np.asarray(y[k]))
        assert not ours.agents


# -- CLI runs ------------------------------------------------------------------------------------


# runs grpo_marl.train in this process, then prints its peak RSS
_PEAK_RSS_TRAIN = """
import resource, runpy, sys
sys.argv = ["grpo_marl.train"] + sys.argv[1:]
code = 0
try:
    runpy.run_module("grpo_marl.train", run_name="__main__")
except SystemExit as exc:
    code = exc.code or 0
print("PEAK_RSS_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
sys.exit(code)
"""


@marl_extra
def test_image_run_trains_under_memory_cap(tmp_path: Path) -> None:
    run = tmp_path / "pong"
    cap_mb = 1500
    proc = _run(
        [
            "-c",
            _PEAK_RSS_TRAIN,
            *PONG_SMALL,
            "algo.group_size=2",
            "algo.num_groups=2",
            "total_steps=300",
            "eval.episodes=2",
            "log.progress=false",
            f"hydra.run.dir={run}",
        ],
        env={"GRPO_MARL_STORAGE_BUDGET_MB": str(cap_mb)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollout storage: obs uint8[40, 40, 2]" in proc.stdout
    peak = float(proc.stdout.split("PEAK_RSS_MB")[1].split()[0])
    assert peak < cap_mb, peak
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    updates = [r for r in rows if "train/advantage_abs_mean" in r]
    assert len(updates) >= 2, rows  # a few updates, each on a batch of uint8 image rows


@marl_extra
def test_storage_over_budget_is_refused(tmp_path: Path) -> None:
    proc = _run(
        [
            "-m",
            "grpo_marl.train",
            *PONG_SMALL,
            "total_steps=100",
            "log.progress=false",
            f"hydra.run.dir={tmp_path / 'x'}",
        ],
        env={"GRPO_MARL_STORAGE_BUDGET_MB": "1"},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "algo.num_groups" in proc.stderr and "env_preprocess.resize" in proc.stderr


def test_missing_extra_message(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['supersuit'] = None; sys.argv = ['train'] + sys.argv[1:]; "
        "from grpo_marl.train import main; main()"
    )
    proc = _run(["-c", code, "env=cooperative_pong", "total_steps=100", f"hydra.run.dir={tmp_path / 'y'}"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert 'pip install -e ".[marl-extra]"' in proc.stderr and "supersuit" in proc.stderr
    assert not (tmp_path / "y" / "metrics.jsonl").exists()


@needs("supersuit", "pygame", "Box2D", "PIL", extra="marl-extra,video")
def test_multiagent_video(tmp_path: Path) -> None:
    run = tmp_path / "mw"
    proc = _run(
        [
            "-m",
            "grpo_marl.train",
            "env=multiwalker",
            "+env_kwargs.max_cycles=40",
            "algo.group_size=2",
            "algo.num_groups=1",
            "total_steps=100",
            "eval.episodes=1",
            "log.progress=false",
            f"hydra.run.dir={run}",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _run(["-m", "grpo_marl.evaluate", f"run={run}", "video=true", "episodes=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    gifs = list((run / "videos").glob("*.gif"))
    assert gifs and gifs[0].stat().st_size > 1000
    greedy = gifs[0].read_bytes()
    # deterministic=false samples actions in the recorded episode too (it used to stay greedy)
    for gif in gifs:
        gif.unlink()
    proc = _run(["-m", "grpo_marl.evaluate", f"run={run}", "video=true", "episodes=1", "deterministic=false"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sampled,) = list((run / "videos").glob("*.gif"))
    assert sampled.read_bytes() != greedy
    bad = _run(["-m", "grpo_marl.evaluate", f"run={run}", "video=maybe"])
    assert bad.returncode == 2


@marl_extra
def test_mappo_image_env_downsampled_state(tmp_path: Path) -> None:
    """MAPPO's centralized critic on an image env reads the downsampled state (flat, 21x21)."""
    run = tmp_path / "mappo"
    proc = _run(
        [
            "-m",
            "grpo_marl.train",
            *PONG_SMALL,
            "algo=mappo",
            "algo.n_envs=2",
            "algo.n_steps=16",
            "algo.batch_size=32",
            "env_preprocess.state_resize=[21,21]",
            "total_steps=64",
            "eval.episodes=1",
            "log.progress=false",
            f"hydra.run.dir={run}",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollout storage: obs uint8[40, 40, 2] x 16 steps x 2 envs" in proc.stdout
    ckpt = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    critic = ckpt["modules"]["critic"]
    first = next(v for k, v in critic.items() if k.endswith("0.weight"))
    # own CNN features (512) + state (21 * 21) + agent one-hot (2) + time (1)
    assert first.shape[1] == 512 + 21 * 21 + 2 + 1
