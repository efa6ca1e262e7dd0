"""The tensor vector-env contract: records are torch tensors on ``VecEnv.device``.

A torch-native env (``tests/torch_envs.py``: CartPole batched in torch, registered through
``register_env(vector_factory=...)``) trains through ``grpo_marl.fit`` in seed and state groups,
and its tensors go through the collectors without a host round trip: it refuses anything but
tensors on its device, and no numpy conversion happens per step on its path. The numpy envs (the
batched ports, the Gymnasium and PettingZoo drivers in this process and in workers) hand out CPU
tensors of the documented dtypes. The CUDA variant runs where CUDA is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import grpo_marl
from grpo_marl.collectors import (
    EpisodeCollector,
    StateGroupCollector,
    StepCollector,
    StreamingCollector,
    evaluate_policy,
)
from grpo_marl.errors import EnvError
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import get_spec, register_env
from grpo_marl.vec import Step, make_vec_env
from grpo_marl.vec.base import HostStep
from grpo_marl.vec.ports.classic import CartPoleVec, PendulumVec
from grpo_marl.vec.ports.mpe import SimpleSpreadVec
from tests.torch_envs import TORCH_CARTPOLE_DEFAULTS, TorchCartPoleVec, register_torch_cartpole

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def assert_record(step: Step, device: torch.device | str, obs_dtype: torch.dtype = torch.float32) -> None:
    """Every field a tensor on ``device`` with the contract's dtype."""
    dev = torch.device(device)
    fields = {
        "obs": obs_dtype,
        "rewards": torch.float32,
        "terminated": torch.bool,
        "truncated": torch.bool,
        "alive": torch.bool,
        "env_done": torch.bool,
        "action_mask": torch.bool,
        "state": torch.float32,
    }
    for name, dtype in fields.items():
        value = getattr(step, name)
        if value is None and name in ("action_mask", "state"):
            continue
        assert isinstance(value, torch.Tensor), f"{name} is {type(value).__name__}, not a tensor"
        assert value.dtype == dtype, f"{name}: {value.dtype}, expected {dtype}"
        assert value.device.type == dev.type, f"{name} on {value.device}, expected {dev}"


# -- the torch env itself --------------------------------------------------------------------------
def test_torch_env_keeps_the_contract() -> None:
    vec = TorchCartPoleVec(6, max_episode_steps=30)
    first = vec.reset([3, 3, 4, 4, 5, 5])
    assert_record(first, "cpu")
    assert torch.equal(first.obs[0], first.obs[1]) and not torch.equal(first.obs[1], first.obs[2])
    assert torch.equal(vec.reset([3], [5]).obs[0], first.obs[0])  # the same seed, the same start
    step = vec.reset([3, 3, 4, 4, 5, 5])
    ended_at: dict[int, int] = {}
    for t in range(40):
        was_done = step.env_done
        step = vec.step(torch.ones((6, 1), dtype=torch.long))  # always push right: the pole falls
        assert_record(step, "cpu")
        for i in step.env_done.nonzero()[:, 0].tolist():
            ended_at.setdefault(i, t)
        assert bool((step.rewards[was_done] == 0).all()) and not bool(step.alive[was_done].any())
    assert len(ended_at) == 6 and bool(step.env_done.all())  # no automatic reset: they stay done
    assert all(t < 30 for t in ended_at.values())  # the pole fell before the time limit
    with pytest.raises(EnvError, match="must be a tensor on cpu"):
        vec.step(np.ones((6, 1), np.int64))  # type: ignore[arg-type]


def test_torch_env_snapshots_and_state_replay_exactly() -> None:
    vec, other = TorchCartPoleVec(4), TorchCartPoleVec(4)
    vec.reset([1, 2, 3, 4])
    gen = torch.Generator().manual_seed(0)
    acts = [torch.randint(0, 2, (4, 1), generator=gen) for _ in range(12)]
    for a in acts[:5]:
        vec.step(a)
    snaps, state = vec.snapshot([0, 1, 2, 3]), vec.get_state()
    ahead = [vec.step(a) for a in acts[5:]]
    vec.restore([0, 1, 2, 3], snaps)
    again = [vec.step(a) for a in acts[5:]]
    other.set_state(state)
    resumed = [other.step(a) for a in acts[5:]]
    for x, y, z in zip(ahead, again, resumed, strict=True):
        assert torch.equal(x.obs, y.obs) and torch.equal(x.obs, z.obs)
        assert torch.equal(x.env_done, y.env_done) and torch.equal(x.env_done, z.env_done)


# -- numpy envs hand out CPU tensors ---------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: CartPoleVec(4, with_state=True), id="cartpole-port"),
        pytest.param(lambda: PendulumVec(4), id="pendulum-port"),
        pytest.param(lambda: SimpleSpreadVec(4, with_state=True), id="simple_spread-port"),
        pytest.param(lambda: make_vec_env(get_spec("cartpole"), 4, vectorization="sync"), id="gym-sync"),
        pytest.param(
            lambda: make_vec_env(get_spec("simple_spread"), 4, vectorization="sync", with_state=True), id="pz-sync"
        ),
        pytest.param(
            lambda: make_vec_env(get_spec("simple_spread"), 4, vectorization="async", num_workers=2), id="pz-async"
        ),
    ],
)
def test_numpy_envs_return_cpu_tensors_of_the_contract_dtypes(make: Any) -> None:
    vec = make()
    try:
        assert vec.backend == "numpy" and vec.device == torch.device("cpu")
        first = vec.reset(list(range(4)))
        assert_record(first, "cpu")
        actions = vec.layout.action_array(4)
        assert actions.dtype == (torch.float32 if vec.layout.continuous else torch.int64)
        step = vec.step(actions)
        assert_record(step, "cpu")
        assert step.obs.shape == (4, vec.layout.num_agents, *vec.layout.obs_shape)
        assert isinstance(step.numpy(), HostStep) and step.numpy().obs.dtype == np.float32
        np.testing.assert_array_equal(step.numpy().obs, step.obs.numpy())  # the same memory
        subset = vec.reset([7, 8], [3, 1])
        assert_record(subset, "cpu")
        assert subset.obs.shape[0] == 2
    finally:
        vec.close()


def test_image_obs_are_uint8_tensors() -> None:
    from gymnasium import spaces

    from grpo_marl.vec.base import layout_of

    lay = layout_of(("agent",), (spaces.Box(0, 255, (8, 8, 3), np.uint8),), (spaces.Discrete(2),))
    assert lay.obs_torch_dtype == torch.uint8
    assert_record(lay.blank(2).to_step(), "cpu", obs_dtype=torch.uint8)


# -- no host round trip on a torch env's path -----------------------------------------------------
class Conversions:
    """Counts numpy conversions (``Tensor.numpy``, ``torch.from_numpy``) and numpy-env boundary
    crossings (``host_actions``, ``HostStep.to_step``) while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts = {"numpy": 0, "from_numpy": 0, "host_actions": 0, "to_step": 0}
        numpy_fn, from_numpy, to_step = torch.Tensor.numpy, torch.from_numpy, HostStep.to_step
        import grpo_marl.vec.base as base

        host_actions = base.host_actions

        def count(name: str, fn: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                self.counts[name] += 1
                return fn(*args, **kwargs)

            return wrapper

        monkeypatch.setattr(torch.Tensor, "numpy", count("numpy", numpy_fn))
        monkeypatch.setattr(torch, "from_numpy", count("from_numpy", from_numpy))
        monkeypatch.setattr(HostStep, "to_step", count("to_step", to_step))
        monkeypatch.setattr(base, "host_actions", count("host_actions", host_actions))

    def reset(self) -> None:
        self.counts = dict.fromkeys(self.counts, 0)


def _collectors(vec: TorchCartPoleVec, groups: AgentGroups, device: str) -> Iterator[tuple[str, Any]]:
    yield "episodes-seed", EpisodeCollector(vec, groups, 4, 4, mode="seed", device=device, seed=0)
    yield "episodes-state", StateGroupCollector(vec, groups, 4, 4, mode="state", device=device, seed=0)
    yield "stream", StreamingCollector(vec, groups, 4, 4, device=device, seed=0)
    yield "steps", StepCollector(vec, groups, n_steps=64, device=device, seed=0)


def _no_round_trip(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    torch.manual_seed(0)
    probe = TorchCartPoleVec(16, device=device, max_episode_steps=60)
    groups = AgentGroups.from_layout(probe.layout)
    policy = ActorPolicy(groups).to(device)
    conv = Conversions(monkeypatch)
    for name, collector in _collectors(TorchCartPoleVec(16, device=device, max_episode_steps=60), groups, device):
        vec = collector.vec
        for _ in range(3):
            before = len(vec.received)
            conv.reset()
            batch = collector.collect(policy)
            steps = len(vec.received) - before
            assert steps >= 20, name
            # per-collection bookkeeping may read a few values back (which episodes ended; in
            # state groups, each of the 4 groups' snapshot and its return so far); nothing per step does
            bound = 2 + (2 * 4 if name == "episodes-state" else 0)
            assert conv.counts["numpy"] + conv.counts["from_numpy"] <= bound < steps, (name, conv.counts, steps)
            assert conv.counts["host_actions"] == 0 and conv.counts["to_step"] == 0, (name, conv.counts)
            assert batch["obs"].device.type == torch.device(device).type
        assert all(kind is torch.Tensor and dev == vec.device for kind, dev in vec.received), name
    conv.reset()
    eval_vec = TorchCartPoleVec(8, device=device, max_episode_steps=60)
    out = evaluate_policy(policy, eval_vec, list(range(8)), device)
    assert out["eval/episodes"] == 8 and conv.counts["host_actions"] == conv.counts["to_step"] == 0
    assert conv.counts["numpy"] + conv.counts["from_numpy"] <= 2 < len(eval_vec.received)
    assert all(kind is torch.Tensor and dev == eval_vec.device for kind, dev in eval_vec.received)


def test_torch_env_records_pass_through_the_collectors_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_round_trip(monkeypatch, "cpu")


# -- training through fit -------------------------------------------------------------------------
def _fit(tmp_path: Path, mode: str, device: str = "cpu") -> tuple[dict[str, Any], list[TorchCartPoleVec]]:
    built: list[TorchCartPoleVec] = []

    def factory(num_envs: int, **kwargs: Any) -> TorchCartPoleVec:
        vec = TorchCartPoleVec(num_envs, **kwargs)
        built.append(vec)
        return vec

    register_env(
        "torch_cartpole_probe",
        kind="gymnasium",
        vector_factory=factory,
        defaults=TORCH_CARTPOLE_DEFAULTS,
        threshold=195.0,
        overwrite=True,
    )
    result = grpo_marl.fit(
        "torch_cartpole_probe",
        run_dir=tmp_path / mode,
        seed=1,
        device=device,
        env_kwargs={"device": device},
        total_steps=6000,
        algo={"group_mode": mode, "lr": 0.003},
        log={"progress": False},
    )
    return result.summary, built


@pytest.mark.parametrize("mode", ["seed", "state"])
def test_torch_env_trains_through_fit(tmp_path: Path, mode: str) -> None:
    summary, built = _fit(tmp_path, mode)
    assert summary["status"] == "completed" and summary["env_steps"] >= 6000
    assert summary["eval/return_mean"] > 30  # a random policy balances ~20 steps
    assert built and all(vec.received for vec in built)
    for vec in built:
        assert all(kind is torch.Tensor and dev == vec.device for kind, dev in vec.received)


def test_torch_cartpole_registers_through_vector_factory() -> None:
    register_torch_cartpole()
    spec = get_spec("torch_cartpole")
    vec = make_vec_env(spec, 4, {}, "auto")
    assert isinstance(vec, TorchCartPoleVec) and vec.backend == "torch"


# -- CUDA ------------------------------------------------------------------------------------------
@CUDA
def test_cuda_torch_env_records_stay_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_round_trip(monkeypatch, "cuda")


@CUDA
def test_cuda_torch_env_trains_through_fit(tmp_path: Path) -> None:
    summary, built = _fit(tmp_path, "seed", device="cuda")
    assert summary["status"] == "completed"
    assert all(vec.device.type == "cuda" for vec in built)
    for vec in built:
        assert all(kind is torch.Tensor and dev == vec.device for kind, dev in vec.received)


@CUDA
def test_cuda_policy_on_a_numpy_port_moves_each_record_once() -> None:
    """A CPU numpy env feeding a CUDA policy: records arrive on the GPU, actions go back to the CPU."""
    vec = CartPoleVec(8)
    groups = AgentGroups.from_layout(vec.layout)
    policy = ActorPolicy(groups).to("cuda")
    batch = EpisodeCollector(vec, groups, 2, 4, device="cuda", seed=0).collect(policy)
    assert batch["obs"].device.type == "cuda" and batch["rewards"].device.type == "cuda"
    assert float(batch["rewards"].sum()) > 0


def test_a_numpy_record_shares_its_arrays_until_copied() -> None:
    """``Step.numpy`` on a numpy env's record gives back its own arrays (the CPU loops read them for
    free); writes through either side are the same memory; a deep copy or pickle drops the link."""
    import copy
    import pickle

    vec = CartPoleVec(3)
    step = vec.reset([0, 1, 2])
    host = step.numpy()
    assert step.numpy() is host and np.shares_memory(host.obs, step.obs.numpy())
    other = vec.reset([5], [1])
    dup = step.copy()
    dup.put([1], other)  # numpy on both sides: written in numpy, seen by the tensors
    assert torch.equal(dup.obs[1], other.obs[0]) and torch.equal(dup.obs[0], step.obs[0])
    dup.put(torch.tensor([2]), other.to("cpu"))
    assert torch.equal(dup.obs[2], other.obs[0])
    for clone in (copy.deepcopy(step), pickle.loads(pickle.dumps(step))):
        assert torch.equal(clone.obs, step.obs) and not np.shares_memory(clone.numpy().obs, host.obs)
    replaced = step.rows([0, 1, 2])  # a derived record has no arrays of its own
    assert not np.shares_memory(replaced.numpy().obs, host.obs)
