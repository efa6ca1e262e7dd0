"""The env registry: short names, ``gym:ID``, ``package.module:factory``, ``register_env`` from
Python, installed entry points, and unknown names that fail listing what is known."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import pytest

import grpo_marl
from grpo_marl.registry import UnknownEnvError, get_spec, list_envs, load_defaults, make_env, register_env

BUILTINS = {
    "cartpole": ("CartPole-v1", 475.0),
    "acrobot": ("Acrobot-v1", -100.0),
    "pendulum": ("Pendulum-v1", -250.0),
    "mountaincar_continuous": ("MountainCarContinuous-v0", 90.0),
}


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_short_names_resolve(name: str) -> None:
    gym_id, threshold = BUILTINS[name]
    spec = get_spec(name)
    assert spec.name == name
    assert spec.kind == "gymnasium"
    assert spec.gym_id == gym_id
    assert spec.threshold == threshold
    assert name in list_envs()
    env = make_env(name)
    try:
        assert env.spec.id == gym_id
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
    finally:
        env.close()


def test_builtins_carry_tuned_defaults() -> None:
    defaults = get_spec("cartpole").defaults
    assert defaults["grpo"]["algo"]["lr"] > 0  # envs/conf/cartpole.yaml is loaded


def test_every_shipped_defaults_file_is_an_envs_defaults() -> None:
    """One format: each envs/conf file (but the shared bases, ``_*.yaml``) is the tuned defaults
    of the registered env of its name, multi-agent and text envs included, and nothing else."""
    from envs import CONF_DIR

    files = sorted(p.stem for p in CONF_DIR.glob("*.yaml") if not p.stem.startswith("_"))
    assert {"cartpole", "simple_spread", "pursuit", "arith_chat", "text_jsonl"} <= set(files)
    for name in files:
        assert get_spec(name).defaults == load_defaults(CONF_DIR / f"{name}.yaml"), name
    spread = get_spec("simple_spread").defaults
    assert spread["grpo"]["algo"]["num_groups"] == 16 and spread["mappo"]["algo"]["lr"] == 0.002


def test_defaults_files_build_on_others_as_in_hydra() -> None:
    """``defaults: [base]`` merges the base file first, then the file's own values: arith_chat
    shares the text settings of ``_text.yaml``, quadratic_chat changes only what differs from
    arith_chat, and a value the file does not repeat is the base's."""
    chat, qchat = get_spec("arith_chat").defaults, get_spec("quadratic_chat").defaults
    assert chat["grpo"]["algo"]["advantage"] == "outcome"  # from _text.yaml
    assert chat["grpo"]["algo"]["aggregation"] == "dapo"  # its own value wins over _text's grpo
    assert qchat["common"]["model"] == chat["common"]["model"]
    assert qchat["grpo"]["algo"]["lr_schedule"] == "constant"
    assert qchat["common"]["text"]["prompt_sampling"] == "uniform"
    assert qchat["grpo"]["algo"]["micro_batch_rows"] == chat["grpo"]["algo"]["micro_batch_rows"]
    assert "defaults" not in chat


def test_register_env_takes_a_defaults_file(registry_sandbox, tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("common:\n  total_steps: 7\n  seed: 3\n")
    (tmp_path / "mine.yaml").write_text("defaults: [base]\ncommon:\n  seed: 4\ngrpo:\n  algo: {lr: 0.5}\n")

    def cartpole() -> gym.Env:
        return gym.make("CartPole-v1")

    spec = register_env("from_file", cartpole, defaults=tmp_path / "mine.yaml")
    assert spec.defaults == {"common": {"total_steps": 7, "seed": 4}, "grpo": {"algo": {"lr": 0.5}}}
    assert register_env("from_str", cartpole, defaults=str(tmp_path / "mine.yaml")).defaults == spec.defaults


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "does not exist"),
        ("common: [unclosed\n", "is not valid YAML"),
        ("- a list\n", "must hold a mapping of sections"),
        ("defaults: 3\n", "'defaults' must be a list of file names"),
        ("defaults: [bad]\n", "includes itself"),
    ],
)
def test_defaults_file_errors_name_the_file(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "bad.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        load_defaults(path)
    assert "bad.yaml" in str(info.value)


def test_top_level_api_is_the_registry() -> None:
    assert grpo_marl.register_env is register_env
    assert grpo_marl.make_env is make_env
    assert grpo_marl.get_spec is get_spec


def test_gym_prefix_any_gymnasium_id(registry_sandbox) -> None:
    spec = get_spec("gym:Acrobot-v1")
    assert spec.gym_id == "Acrobot-v1"
    assert spec.kind == "gymnasium"
    # A gym: alias of a built-in reuses its tuned defaults and threshold.
    assert spec.defaults == get_spec("acrobot").defaults
    assert spec.threshold == -100.0
    env = make_env("gym:Acrobot-v1")
    try:
        assert env.spec.id == "Acrobot-v1"
    finally:
        env.close()


def test_gym_prefix_without_builtin_alias_uses_gymnasium_threshold(registry_sandbox) -> None:
    spec = get_spec("gym:MountainCar-v0")
    assert spec.gym_id == "MountainCar-v0"
    assert spec.defaults == {}
    assert spec.threshold == gym.spec("MountainCar-v0").reward_threshold


def test_gym_prefix_unknown_id() -> None:
    with pytest.raises(UnknownEnvError, match="NoSuchEnv-v9"):
        get_spec("gym:NoSuchEnv-v9")


def test_module_factory_reference(registry_sandbox) -> None:
    spec = get_spec("tests.custom_envs:make_toy")
    from tests.custom_envs import make_toy

    assert spec.factory is make_toy
    assert spec.kind == "gymnasium"
    # factory attributes become the spec's tuned defaults and threshold
    assert spec.defaults == {"grpo": {"algo": {"group_size": 4, "num_groups": 3}}}
    assert spec.threshold == 123.0
    env = make_env("tests.custom_envs:make_toy", max_episode_steps=7)
    try:
        assert env.spec.max_episode_steps == 7  # kwargs reach the factory
    finally:
        env.close()


@pytest.mark.parametrize(
    "name, message",
    [
        ("tests.no_such_module:make", "cannot import module 'tests.no_such_module'"),
        ("tests.custom_envs:no_such_factory", "has no attribute 'no_such_factory'"),
    ],
)
def test_module_factory_errors(name: str, message: str) -> None:
    with pytest.raises(UnknownEnvError, match=message):
        get_spec(name)


def test_non_callable_factory(registry_sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.custom_envs as mod

    monkeypatch.setattr(mod, "NOT_A_FACTORY", 3, raising=False)
    with pytest.raises(UnknownEnvError, match="not callable"):
        get_spec("tests.custom_envs:NOT_A_FACTORY")


def test_register_env_from_python(registry_sandbox) -> None:
    calls = []

    def factory(**kwargs):
        calls.append(kwargs)
        return gym.make("Pendulum-v1", **kwargs)

    spec = register_env(
        "my_pendulum",
        factory,
        defaults={"algo": {"group_size": 4}},
        threshold=-300.0,
        description="mine",
    )
    assert get_spec("my_pendulum") is spec
    assert "my_pendulum" in list_envs()
    env = make_env("my_pendulum", g=9.81)
    env.close()
    assert calls == [{"g": 9.81}]
    assert spec.defaults == {"algo": {"group_size": 4}}
    assert spec.threshold == -300.0
    # Registering the same factory again is a no-op; a different one needs overwrite=True.
    assert register_env("my_pendulum", factory) is spec
    with pytest.raises(ValueError, match="overwrite=True"):
        register_env("my_pendulum", lambda: gym.make("CartPole-v1"))
    replaced = register_env("my_pendulum", lambda: gym.make("CartPole-v1"), overwrite=True)
    assert get_spec("my_pendulum") is replaced


def test_register_env_gym_id_only(registry_sandbox) -> None:
    spec = register_env("short_cartpole", gym_id="CartPole-v1")
    env = spec.make(max_episode_steps=5)
    try:
        assert env.spec.id == "CartPole-v1" and env.spec.max_episode_steps == 5
    finally:
        env.close()


@pytest.mark.parametrize(
    "kwargs, message",
    [({"kind": "robot"}, "kind must be one of"), ({}, "give a factory, a vector_factory or a gym_id")],
)
def test_register_env_rejects_bad_arguments(registry_sandbox, kwargs: dict, message: str) -> None:
    factory = None if not kwargs else (lambda: None)
    with pytest.raises(ValueError, match=message):
        register_env("bad", factory, **kwargs)


def _install_fake_distribution(root: Path, entry_points: str) -> None:
    dist = root / "fake_grpo_envs-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-grpo-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(entry_points)


def test_installed_entry_points(registry_sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A third-party package's ``grpo_marl.envs`` entry points: a factory is registered under the
    entry's name; a hook that registers envs itself is simply called."""
    _install_fake_distribution(
        tmp_path,
        "[grpo_marl.envs]\nep_factory_env = tests.custom_envs:make_toy\nep_hook = tests.custom_envs:register_hook\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry_sandbox.ENVS.entry_points_loaded = False
    names = list_envs()
    assert "ep_factory_env" in names
    assert "ep_hook_env" in names  # registered by the hook
    assert "ep_hook" not in names  # the hook itself is not an env
    from tests.custom_envs import make_toy

    assert get_spec("ep_factory_env").factory is make_toy
    assert get_spec("ep_hook_env").threshold == 7.0
    env = make_env("ep_factory_env")
    env.close()


def test_entry_points_are_loaded_on_lookup(registry_sandbox, tmp_path: Path, monkeypatch) -> None:
    _install_fake_distribution(tmp_path, "[grpo_marl.envs]\nep_lookup_env = tests.custom_envs:make_toy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry_sandbox.ENVS.entry_points_loaded = False
    assert get_spec("ep_lookup_env").name == "ep_lookup_env"  # without calling list_envs() first


def test_unknown_name_lists_known_names(registry_sandbox) -> None:
    register_env("zz_custom", lambda: gym.make("CartPole-v1"))
    with pytest.raises(UnknownEnvError) as info:
        get_spec("cartpoel")
    message = str(info.value)
    assert "'cartpoel'" in message
    for known in [*BUILTINS, "zz_custom"]:
        assert known in message
    assert "gym:" in message and "package.module:factory" in message
    assert isinstance(info.value, KeyError)  # callers catching KeyError keep working


def test_builtin_modules_import_cheaply() -> None:
    """Looking up a control env must not drag in the LLM stack."""
    import subprocess

    code = (
        "import sys; from grpo_marl.registry import get_spec; get_spec('cartpole'); "
        "print('transformers' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_pz_ids_resolve_to_parallel_envs(registry_sandbox) -> None:
    """``env=pz:<namespace>/<name>-v<N>`` (the documented form; AEC-only ids included)."""
    spec = get_spec("pz:sisl/pursuit-v5")
    assert spec.kind == "pettingzoo" and spec.name == "pz:sisl/pursuit-v5"
    env = spec.make(max_cycles=5, n_pursuers=2, n_evaders=2, x_size=8, y_size=8)
    try:
        obs, _ = env.reset(seed=0)
        assert set(obs) == set(env.agents) and len(env.agents) == 2
        obs, rewards, *_ = env.step({agent: env.action_space(agent).sample() for agent in env.agents})
        assert set(rewards) == set(obs)
    finally:
        env.close()
    assert get_spec("pz:sisl/pursuit-v5") is spec  # registered once


def test_pz_turn_based_games_are_refused_with_the_reason(registry_sandbox) -> None:
    from grpo_marl.errors import UserInputError

    with pytest.raises(UserInputError, match="is a turn-based game .* cannot be stepped as a parallel env"):
        get_spec("pz:classic/tictactoe-v3")
    with pytest.raises(
        UnknownEnvError, match="PettingZoo has no id 'sisl/nothing-v1'; ids look like pz:sisl/pursuit-v5"
    ):
        get_spec("pz:sisl/nothing-v1")


def test_unknown_name_suggests_the_closest(registry_sandbox) -> None:
    with pytest.raises(UnknownEnvError, match="unknown env 'cartpol'. Did you mean cartpole?"):
        get_spec("cartpol")
    with pytest.raises(UnknownEnvError, match="cannot import module 'no_such_pkg.envs'. Known envs: acrobot"):
        get_spec("no_such_pkg.envs:make")
