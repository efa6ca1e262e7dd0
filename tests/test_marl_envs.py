"""Multi-agent env construction: short names, Parallel API compliance, the fast mpe2 driver's
equivalence with mpe2's own parallel env, and snapshot/restore exactness."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from grpo_marl.marl.envs import MARL_ENVS, MPE2_MODULES, MPEParallelEnv, make_parallel_env, marl_env_names
from grpo_marl.vec.snapshot import restore_env, snapshot_env

SHIPPED = ["simple_spread", "simple_speaker_listener", "pursuit"]


def test_mpe2_module_list_matches_mpe2() -> None:
    from mpe2.all_modules import mpe_environments

    assert sorted(k.split("/")[1] for k in mpe_environments) == sorted(MPE2_MODULES)


def test_short_names_cover_mpe2_and_pettingzoo_registry() -> None:
    import pettingzoo

    names = marl_env_names()
    for short in ("simple_spread", "simple_speaker_listener", "simple_tag", "pursuit", "pistonball", "multiwalker"):
        assert short in names
    for env_id in pettingzoo.parallel_registry:
        assert env_id in MARL_ENVS
    assert MARL_ENVS["simple_spread_v3"].target == "simple_spread_v3"
    assert MARL_ENVS["pursuit_v5"].target == "sisl/pursuit-v5"


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(KeyError, match="simple_spread"):
        make_parallel_env("no_such_env")


def test_shipped_defaults_and_overrides() -> None:
    env = make_parallel_env("simple_spread")
    assert len(env.possible_agents) == 3 and env.raw.max_cycles == 25
    env = make_parallel_env("simple_spread", N=4)
    assert len(env.possible_agents) == 4
    env = make_parallel_env("pursuit", max_cycles=7)
    assert len(env.possible_agents) == 4 and env.unwrapped.env.max_cycles == 7


@pytest.mark.parametrize("name", SHIPPED)
def test_parallel_api(name: str) -> None:
    parallel_api_test(make_parallel_env(name), num_cycles=60)


def test_parallel_api_reference_mpe2_env() -> None:
    parallel_api_test(make_parallel_env("simple_spread", fast=False), num_cycles=30)


def test_aec_route_matches_parallel_route() -> None:
    kw = dict(max_cycles=6, x_size=8, y_size=8, n_pursuers=2, n_evaders=2)
    via_aec = make_parallel_env("pz:aec:sisl/pursuit-v5", **kw)
    direct = make_parallel_env("pz:sisl/pursuit-v5", **kw)
    parallel_api_test(via_aec, num_cycles=10)
    o1, _ = via_aec.reset(seed=0)
    o2, _ = direct.reset(seed=0)
    assert o1.keys() == o2.keys()
    while direct.agents:
        act = {a: 1 for a in direct.agents}
        (o1, r1, *_), (o2, r2, *_) = via_aec.step(act), direct.step(act)
        assert r1 == r2
        for a in o1:
            np.testing.assert_array_equal(o1[a], o2[a])


def test_turn_based_aec_env_is_refused_with_a_reason() -> None:
    with pytest.raises(AssertionError, match="is_parallelizable"):
        make_parallel_env("pz:classic/tictactoe-v3")


@pytest.mark.parametrize("name", ["simple_spread", "simple_speaker_listener", "simple_tag"])
def test_fast_mpe_driver_equals_mpe2_parallel_env(name: str) -> None:
    fast, ref = make_parallel_env(name), make_parallel_env(name, fast=False)
    assert isinstance(fast, MPEParallelEnv)
    fo, _ = fast.reset(seed=3)
    ro, _ = ref.reset(seed=3)
    for a in fo:
        np.testing.assert_array_equal(fo[a], ro[a])
    rng = np.random.default_rng(0)
    while ref.agents:
        act = {a: int(rng.integers(ref.action_space(a).n)) for a in ref.agents}
        out_f, out_r = fast.step(act), ref.step(act)
        for df, dr in zip(out_f, out_r):
            assert df.keys() == dr.keys()
            for a in df:
                if isinstance(df[a], np.ndarray):
                    np.testing.assert_array_equal(df[a], dr[a])
                else:
                    assert df[a] == dr[a]
        assert fast.agents == ref.agents
        np.testing.assert_array_equal(fast.state(), ref.state())
    assert not fast.agents


def _random_actions(env, rng: np.random.Generator, k: int) -> list[dict]:
    return [{a: int(rng.integers(env.action_space(a).n)) for a in env.possible_agents} for _ in range(k)]


def _play(env, actions: list[dict]) -> list[tuple]:
    out = []
    for act in actions:
        obs, rew, term, trunc, _ = env.step({a: act[a] for a in env.agents})
        out.append(({a: o.copy() for a, o in obs.items()}, rew, term, trunc))
    return out


@pytest.mark.parametrize("name", SHIPPED)
def test_snapshot_restore_reproduces_next_steps(name: str) -> None:
    env = make_parallel_env(name, max_cycles=20)
    env.reset(seed=5)
    rng = np.random.default_rng(1)
    _play(env, _random_actions(env, rng, 4))
    snap = snapshot_env(env)
    actions = _random_actions(env, rng, 16)  # runs past max_cycles: truncation must replay too
    first = _play(env, actions[:16])
    env.reset(seed=99)  # scramble the state (and the RNG)
    _play(env, _random_actions(env, rng, 3))
    for _ in range(2):  # a snapshot can be restored more than once
        env = restore_env(env, snap)
        again = _play(env, actions[:16])
        assert len(again) == len(first)
        for (o1, r1, te1, tr1), (o2, r2, te2, tr2) in zip(first, again):
            assert r1 == r2 and te1 == te2 and tr1 == tr2
            for a in o1:
                np.testing.assert_array_equal(o1[a], o2[a])


@pytest.mark.parametrize("fast", [True, False])
def test_deepcopy_of_mpe2_env_loses_state(fast: bool) -> None:
    """The trap the explicit snapshot exists for: ``copy.deepcopy`` of an mpe2 env (EzPickle)
    rebuilds a fresh env from its constructor arguments, so the clone is back at step 0 in another
    world; :func:`snapshot_env` keeps the step counter and the world."""
    env = make_parallel_env("simple_spread", fast=fast)
    env.reset(seed=1)
    for _ in range(3):
        env.step({a: 2 for a in env.agents})
    pos = env.unwrapped.world.agents[0].state.p_pos.copy()
    clone = copy.deepcopy(env)
    assert env.unwrapped.steps == 3
    assert clone.unwrapped.steps == 0
    assert not np.array_equal(clone.unwrapped.world.agents[0].state.p_pos, pos)
    restored = restore_env(make_parallel_env("simple_spread", fast=fast), snapshot_env(env))
    assert restored.unwrapped.steps == 3
    np.testing.assert_array_equal(restored.unwrapped.world.agents[0].state.p_pos, pos)
