"""The batched mpe2 ports against mpe2 itself: the same seeds and actions give the same episodes.

Each test drives a batch of port envs and, side by side, one mpe2 ``parallel_env`` per batch row
with the same per-env seeds and actions, and compares every step: observations to 1e-5 (they are
float32 casts of the same float64 values, so in practice bit-equal), rewards (as float32),
terminations and truncations exactly, ``alive``/``env_done`` against mpe2's live agent list and
``Step.state`` against ``env.state()``. Batches have envs sharing a seed, run whole episodes and
reset a subset mid-batch, so done envs (final observation kept, rewards 0) are covered too.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from pettingzoo.utils.env_logger import EnvLogger

from grpo_marl.errors import EnvError, UserInputError
from grpo_marl.vec.base import Step
from grpo_marl.vec.ports import PORTS, port_class
from grpo_marl.vec.ports.mpe import SimpleReferenceVec, SimpleSpeakerListenerVec, SimpleSpreadVec, SimpleVec
from tests.torch_envs import numpy_records

CLASSES = {
    "simple_spread_v3": SimpleSpreadVec,
    "simple_speaker_listener_v4": SimpleSpeakerListenerVec,
    "simple_reference_v3": SimpleReferenceVec,
    "simple_v3": SimpleVec,  # same physics, not in the registry
}

# (scenario, mpe2 kwargs): defaults plus the kwargs each port implements
CASES = [
    ("simple_spread_v3", {}),
    ("simple_spread_v3", {"N": 4, "local_ratio": 0.3, "max_cycles": 12}),
    ("simple_speaker_listener_v4", {}),
    ("simple_reference_v3", {}),
    ("simple_reference_v3", {"local_ratio": 0.8, "max_cycles": 9}),
    ("simple_v3", {}),
    ("simple_spread_v3", {"N": 1, "max_cycles": 5}),
]


@pytest.fixture(autouse=True)
def _quiet_mpe2():
    """mpe2's clip wrapper logs every out-of-range continuous action (the tests send some)."""
    EnvLogger.suppress_output()
    yield
    EnvLogger.unsuppress_output()


def _mpe2(name: str, **kwargs):
    return importlib.import_module(f"mpe2.{name}").parallel_env(**kwargs)


def _actions(vec, rng: np.random.Generator) -> np.ndarray:
    """Random actions; continuous ones partly outside [0, 1] so the clipping is exercised."""
    lay = vec.layout
    if lay.continuous:
        return rng.uniform(-0.1, 1.1, (vec.num_envs, lay.num_agents, max(lay.action_dims))).astype(np.float32)
    return np.stack([rng.integers(0, n, vec.num_envs) for n in lay.n_actions], axis=1)


def _to_mpe2(vec, actions: np.ndarray, e: int, env) -> dict:
    lay = vec.layout
    out = {}
    for k, agent in enumerate(lay.agents):
        if agent in env.agents:
            out[agent] = actions[e, k, : lay.action_dims[k]] if lay.continuous else int(actions[e, k])
    return out


class Mirror:
    """One mpe2 parallel env per batch row, with the last step's per-row record to compare."""

    def __init__(self, vec, name: str, kwargs: dict) -> None:
        self.vec = vec
        self.envs = [_mpe2(name, **kwargs) for _ in range(vec.num_envs)]
        self.last_obs: list[dict] = [{} for _ in self.envs]
        self.collided = False

    def reset(self, seeds, indices) -> None:
        for e, s in zip(indices, seeds, strict=True):
            self.last_obs[e], _ = self.envs[e].reset(seed=s)

    def check_rows(self, step: Step, rows, fresh: bool) -> None:
        """Rows ``rows`` of ``step`` against the mirror envs (``step`` indexed 0.. when ``fresh``)."""
        lay = self.vec.layout
        for r, e in enumerate(rows):
            i = r if fresh else e
            env = self.envs[e]
            for k, agent in enumerate(lay.agents):
                d = lay.obs_dims[k]
                np.testing.assert_allclose(step.obs[i, k, :d], self.last_obs[e][agent], rtol=0, atol=1e-5)
                assert not step.obs[i, k, d:].any()  # zero padding past the agent's own length
                assert step.alive[i, k] == (agent in env.agents)
            assert step.env_done[i] == (not env.agents)
            if step.state is not None:
                np.testing.assert_allclose(step.state[i], env.unwrapped.state(), rtol=0, atol=1e-5)

    def step(self, actions: np.ndarray, step: Step) -> None:
        lay = self.vec.layout
        for e, env in enumerate(self.envs):
            if not env.agents:  # a done env: not stepped, final obs kept, nothing reported
                assert not step.rewards[e].any() and not step.terminated[e].any() and not step.truncated[e].any()
                continue
            obs, rew, term, trunc, _ = env.step(_to_mpe2(self.vec, actions, e, env))
            self.last_obs[e] = obs
            for k, agent in enumerate(lay.agents):
                assert step.rewards[e, k] == np.float32(rew[agent]), (e, agent)
                assert step.terminated[e, k] == term[agent]
                assert step.truncated[e, k] == trunc[agent]
            if len(set(rew.values())) > 1:
                self.collided = True
        self.check_rows(step, range(self.vec.num_envs), fresh=False)


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_trajectories_equal_mpe2(name, kwargs, continuous):
    kwargs = {**kwargs, "continuous_actions": continuous}
    E = 6
    vec = CLASSES[name](E, with_state=True, **kwargs)
    mirror = Mirror(vec, name, kwargs)
    rng = np.random.default_rng(len(name) + 7 * continuous)
    seeds = [11, 11, 5, 0, 11, 12345]  # envs sharing a seed start from the same state
    first = vec.reset(seeds)
    mirror.reset(seeds, range(E))
    mirror.check_rows(first, range(E), fresh=False)
    assert first.alive.all() and not first.env_done.any() and not first.rewards.any()
    np.testing.assert_array_equal(first.obs[0], first.obs[1])

    horizon = vec.max_episode_steps
    reset_at = horizon // 2
    for t in range(2 * horizon):
        actions = _actions(vec, rng)
        if t == reset_at:
            idx, new_seeds = [4, 1], [3, 11]  # a subset, out of order, one reusing a live seed
            part = vec.reset(new_seeds, idx)
            mirror.reset(new_seeds, idx)
            mirror.check_rows(part, idx, fresh=True)
        step = vec.step(actions)
        mirror.step(actions, step)
        if step.env_done.all():
            break
    assert step.env_done.all()
    assert t > horizon  # the reset envs ran on after the others finished
    if name == "simple_spread_v3" and kwargs.get("N", 3) > 1:
        # the soft-contact forces and the per-agent collision penalty were exercised
        assert mirror.collided
    # once every env is done, stepping changes nothing
    again = vec.step(_actions(vec, rng))
    np.testing.assert_array_equal(again.obs, step.obs)
    assert not again.alive.any() and not again.rewards.any() and again.env_done.all()


@pytest.mark.parametrize("name", list(CLASSES))
def test_spaces_and_layout_match_mpe2(name):
    for continuous in (False, True):
        vec = CLASSES[name](2, continuous_actions=continuous)
        env = _mpe2(name, continuous_actions=continuous)
        lay = vec.layout
        assert vec.name == name
        assert port_class(name) is (CLASSES[name] if name in PORTS else None)
        assert lay.agents == tuple(env.possible_agents)
        for k, agent in enumerate(lay.agents):
            assert lay.observation_spaces[k] == env.observation_space(agent)
            assert lay.action_spaces[k] == env.action_space(agent)
        assert lay.state_dim == env.state_space.shape[0]
        assert lay.obs_dtype == np.float32 and lay.continuous == continuous
        assert vec.max_episode_steps == 25 and vec.supports_snapshot


def test_seed_none_continues_the_env_generator_like_mpe2():
    vec = numpy_records(SimpleReferenceVec(2))
    env = _mpe2("simple_reference_v3")
    vec.reset([8, 9])
    env.reset(seed=8)
    obs, _ = env.reset()  # seed None: mpe2 draws from the generator seeded by the last seed
    step = vec.reset([None], [0])
    for k, agent in enumerate(vec.agents):
        np.testing.assert_allclose(step.obs[0, k], obs[agent], atol=1e-5, rtol=0)


def test_terminate_on_success_matches_mpe2():
    """Both envs put every agent on its landmark; the next step ends the episode by termination."""
    kwargs = {"terminate_on_success": True}
    vec = numpy_records(SimpleSpreadVec(2, **kwargs))
    env = _mpe2("simple_spread_v3", **kwargs)
    vec.reset([4, 5])
    env.reset(seed=4)
    (snap,) = vec.snapshot([0])
    snap.apos[:] = snap.lpos  # agent i on landmark i
    vec.restore([0], [snap])
    world = env.unwrapped.world
    for agent, lm in zip(world.agents, world.landmarks, strict=True):
        agent.state.p_pos = lm.state.p_pos.copy()
    step = vec.step(np.zeros((2, 3), np.int64))
    obs, rew, term, trunc, _ = env.step({a: 0 for a in env.agents})
    assert step.terminated[0].all() and not step.truncated[0].any() and step.env_done[0]
    assert all(term.values()) and not any(trunc.values())
    assert not step.terminated[1].any() and not step.env_done[1]
    for k, agent in enumerate(vec.agents):
        assert step.rewards[0, k] == np.float32(rew[agent])
        np.testing.assert_allclose(step.obs[0, k], obs[agent], atol=1e-5, rtol=0)


def test_curriculum_stage_zero_drops_the_collision_penalty():
    vec = numpy_records(SimpleSpreadVec(1, curriculum=True))
    env = _mpe2("simple_spread_v3", curriculum=True)
    vec.reset([2])
    env.reset(seed=2)
    (snap,) = vec.snapshot([0])
    snap.apos[:] = 0.01 * np.arange(3)[:, None]  # all three agents overlapping
    vec.restore([0], [snap])
    for i, agent in enumerate(env.unwrapped.world.agents):
        agent.state.p_pos = 0.01 * np.full(2, float(i))
    for stage in (0, 1):
        vec.set_curriculum_stage(stage)
        env.unwrapped.set_curriculum_stage(stage)
        step = vec.step(np.zeros((1, 3), np.int64))
        _, rew, *_ = env.step({a: 0 for a in env.agents})
        assert [np.float32(rew[a]) for a in vec.agents] == list(step.rewards[0])


def _run(vec, actions: list[np.ndarray], reset_seeds=None) -> list[Step]:
    out = []
    for t, a in enumerate(actions):
        if reset_seeds is not None and t == len(actions) // 2:
            out.append(vec.reset(reset_seeds, list(range(len(reset_seeds)))))
        out.append(vec.step(a))
    return out


def _same(a: list[Step], b: list[Step]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for field in ("obs", "rewards", "terminated", "truncated", "alive", "env_done", "state"):
            u, v = getattr(x, field), getattr(y, field)
            if u is None:
                assert v is None
            else:
                np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
def test_snapshot_restore_replays_exactly(name, continuous):
    vec = CLASSES[name](4, with_state=True, continuous_actions=continuous, max_cycles=10)
    rng = np.random.default_rng(3)
    vec.reset([1, 2, 3, 4])
    for _ in range(4):
        vec.step(_actions(vec, rng))
    snaps = vec.snapshot([0, 1, 2, 3])
    at_snapshot = vec.observations().obs
    actions = [_actions(vec, rng) for _ in range(8)]
    # seeds None at the mid reset: the restored RNGs must draw the same new episodes
    first = _run(vec, actions, reset_seeds=[None, None])
    vec.restore([0, 1, 2, 3], snaps)
    second = _run(vec, actions, reset_seeds=[None, None])
    _same(first, second)

    # a snapshot restored into another row continues that env's episode there
    vec.restore([0, 1, 2, 3], snaps)
    vec.restore([3], [snaps[0]])
    a = _actions(vec, rng)
    a[3] = a[0]
    step = vec.step(a)
    np.testing.assert_array_equal(step.obs[3], step.obs[0])
    np.testing.assert_array_equal(step.rewards[3], step.rewards[0])
    # snapshots are independent copies: stepping did not change them
    vec.restore([0, 1, 2, 3], snaps)
    np.testing.assert_array_equal(vec.observations().obs, at_snapshot)


@pytest.mark.parametrize("name", list(CLASSES))
def test_get_state_set_state_round_trip(name):
    vec = CLASSES[name](3, with_state=True, max_cycles=6)
    rng = np.random.default_rng(0)
    vec.reset([7, 7, 8])
    for _ in range(7):  # past the episode end: done flags are part of the state
        vec.step(_actions(vec, rng))
    vec.reset([9], [1])
    vec.step(_actions(vec, rng))
    state = vec.get_state()
    actions = [_actions(vec, rng) for _ in range(6)]
    first = _run(vec, actions, reset_seeds=[None, None, None])
    other = CLASSES[name](3, with_state=True, max_cycles=6)
    other.set_state(state)
    second = _run(other, actions, reset_seeds=[None, None, None])
    _same(first, second)


def test_done_rows_ignore_their_actions_and_keep_the_final_observation():
    vec = numpy_records(SimpleSpreadVec(2, max_cycles=2))
    vec.reset([0, 1])
    a = np.zeros((2, 3), np.int64)
    vec.step(a)
    final = vec.step(a)
    assert final.truncated.all() and final.env_done.all() and not final.alive.any()
    vec.reset([5], [1])
    bad = np.array([[-1, 99, 7], [1, 2, 3]])  # row 0 is done: its (invalid) actions are ignored
    step = vec.step(bad)
    np.testing.assert_array_equal(step.obs[0], final.obs[0])
    assert step.env_done[0] and not step.rewards[0].any() and not step.truncated[0].any()
    assert step.alive[1].all()
    with pytest.raises(EnvError, match="outside Discrete"):
        vec.step(np.array([[0, 0, 0], [0, 5, 0]]))


@pytest.mark.parametrize(
    ("cls", "kwargs", "named"),
    [
        (SimpleSpreadVec, {"not_a_kwarg": 1}, "not_a_kwarg"),
        (SimpleSpeakerListenerVec, {"local_ratio": 0.5}, "local_ratio"),
        (SimpleSpreadVec, {"num_agent_neighbors": 2}, "num_agent_neighbors"),
        (SimpleReferenceVec, {"render_mode": "human"}, "render_mode"),
        (SimpleReferenceVec, {"local_ratio": 1.5}, "local_ratio"),
        (SimpleSpreadVec, {"N": 0}, "N"),
    ],
)
def test_bad_kwargs_name_the_kwarg(cls, kwargs, named):
    with pytest.raises(UserInputError, match=named):
        cls(2, **kwargs)


def test_max_episode_steps_overrides_max_cycles():
    vec = numpy_records(SimpleReferenceVec(1, max_episode_steps=3))
    assert vec.max_episode_steps == 3
    vec.reset([0])
    steps = [vec.step(np.zeros((1, 2), np.int64)) for _ in range(3)]
    assert [bool(s.truncated.all()) for s in steps] == [False, False, True]
