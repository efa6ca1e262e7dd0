"""Config composition and validation: bad values fail before anything is built, naming the key and
what to change; env defaults sit between the base files and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

from grpo_marl.config import ConfigError, env_defaults
from grpo_marl.registry import UnknownEnvError, get_spec, register_env

pytestmark = pytest.mark.usefixtures("single_thread")


def error_of(resolve, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(overrides)
    return str(info.value)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("algo.group_size=1", ["algo.group_size=1", "at least 2", "algo.group_size=8"]),
        ("algo.group_size=0", ["algo.group_size=0", "at least 2"]),
        ("algo.lr=0", ["algo.lr=0", "> 0"]),
        ("algo.lr=-0.001", ["algo.lr=-0.001", "> 0"]),
        ("algo.num_groups=0", ["algo.num_groups=0", "> 0"]),
        ("algo.epochs=1.5", ["algo.epochs=1.5", "integer"]),
        ("algo.clip_eps_low=1.0", ["algo.clip_eps_low=1.0", "< 1"]),
        ("algo.gamma=1.5", ["algo.gamma=1.5", "[0, 1]"]),
        ("total_steps=0", ["total_steps=0", "> 0"]),
        ("eval.episodes=0", ["eval.episodes=0", "> 0"]),
        ("algo.beta=-1", ["algo.beta=-1", ">= 0"]),
    ],
)
def test_bad_values_name_key_and_fix(resolve, override: str, expected: list[str]) -> None:
    message = error_of(resolve, ["env=cartpole", override])
    for part in expected:
        assert part in message, message


@pytest.mark.parametrize(
    "override, options",
    [
        ("algo.advantage=gae", "outcome, rtg"),
        ("algo.scale=global", "group, batch, none"),
        ("algo.zero_std=drop", "keep, skip, resample"),
        ("algo.lr_schedule=step", "constant, linear, cosine"),
        ("algo.group_mode=episode", "seed, state"),
        ("algo.aggregation=sum", "dapo"),
        ("algo.loss=ppo_clip", "grpo"),
        ("vec.vectorization=threads", "auto, native, sync, async"),
        ("device=tpu", "auto, cpu, cuda"),
    ],
)
def test_bad_choices_list_the_options(resolve, override: str, options: str) -> None:
    key = override.split("=")[0]
    message = error_of(resolve, ["env=cartpole", override])
    assert key in message and options in message, message


def test_all_problems_reported_at_once(resolve) -> None:
    message = error_of(resolve, ["env=cartpole", "algo.group_size=1", "algo.lr=0", "algo.scale=x"])
    assert "algo.group_size" in message and "algo.lr" in message and "algo.scale" in message


def test_multi_agent_group_mode_on_single_agent_env(resolve) -> None:
    message = error_of(resolve, ["env=cartpole", "algo.group_mode=agent"])
    assert "algo.group_mode=agent" in message and "seed or state" in message


def test_state_groups_need_snapshots(resolve) -> None:
    message = error_of(resolve, ["env=pendulum", "algo.group_mode=state", "vec.vectorization=async"])
    assert "vec.vectorization=sync" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_cuda(resolve, device: str) -> None:
    message = error_of(resolve, ["env=cartpole", f"device={device}"])
    assert f"device={device}" in message and "device=cpu" in message and "CUDA is not available" in message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_accepted_when_present(resolve) -> None:
    assert resolve(["env=cartpole", "device=cuda"]).device == "cuda"


def test_unknown_key_fails_in_composition(compose) -> None:
    with pytest.raises(ConfigCompositionException, match="grup_size"):
        compose(["env=cartpole", "algo.grup_size=8"])


def test_unknown_env_lists_known(resolve) -> None:
    with pytest.raises(UnknownEnvError, match="cartpole"):
        resolve(["env=cartpol"])


# --------------------------------------------------------------------------- env defaults merge
def test_env_default_beats_base_file(compose, resolve) -> None:
    base = compose(["env=cartpole"])
    cfg = resolve(["env=cartpole"])
    tuned = get_spec("cartpole").defaults
    assert base.algo.lr != tuned["grpo"]["algo"]["lr"]  # the test means something
    assert cfg.algo.lr == tuned["grpo"]["algo"]["lr"]
    assert cfg.total_steps == tuned["common"]["total_steps"]
    assert cfg.eval.every_steps == tuned["common"]["eval"]["every_steps"]
    assert cfg.train.threshold == 475.0  # from the registry
    assert cfg.vec.num_envs == cfg.algo.num_groups * cfg.algo.group_size  # derived
    assert cfg.env_kind == "gymnasium"


@pytest.mark.parametrize("lr", ["0.01", "0.0003"])
def test_override_beats_env_default(compose, resolve, lr: str) -> None:
    """Including an override equal to the *base* file's value (0.0003): the user said it."""
    assert compose(["env=cartpole"]).algo.lr == 0.0003
    cfg = resolve(["env=cartpole", f"algo.lr={lr}", "total_steps=1234", "eval.every_steps=0"])
    assert cfg.algo.lr == float(lr)
    assert cfg.total_steps == 1234
    assert cfg.eval.every_steps == 0
    assert cfg.algo.epochs == get_spec("cartpole").defaults["grpo"]["algo"]["epochs"]


def test_override_of_threshold_and_num_envs(resolve) -> None:
    cfg = resolve(["env=cartpole", "train.threshold=100", "algo.num_groups=2", "algo.group_size=3"])
    assert cfg.train.threshold == 100
    assert cfg.vec.num_envs == 6


def test_python_registered_defaults(registry_sandbox, resolve) -> None:
    register_env("flat_defaults_env", gym_id="CartPole-v1", defaults={"algo": {"group_size": 4}, "total_steps": 777})
    cfg = resolve(["env=flat_defaults_env"])
    assert cfg.algo.group_size == 4 and cfg.total_steps == 777
    cfg = resolve(["env=flat_defaults_env", "algo.group_size=6"])
    assert cfg.algo.group_size == 6 and cfg.total_steps == 777


def test_per_algo_sections(registry_sandbox) -> None:
    spec = register_env(
        "sectioned_env",
        gym_id="CartPole-v1",
        defaults={"common": {"total_steps": 5}, "grpo": {"algo": {"lr": 0.5}}, "ppo": {"algo": {"lr": 0.1}}},
    )
    assert env_defaults(spec, "grpo") == {"total_steps": 5, "algo": {"lr": 0.5}}
    assert env_defaults(spec, "ppo") == {"total_steps": 5, "algo": {"lr": 0.1}}


def test_module_factory_defaults_apply(resolve) -> None:
    cfg = resolve(["env=tests.custom_envs:make_toy"])
    assert (cfg.algo.group_size, cfg.algo.num_groups, cfg.vec.num_envs) == (4, 3, 12)
    assert cfg.train.threshold == 123.0


def test_invalid_env_defaults_are_reported(registry_sandbox, resolve) -> None:
    register_env("bad_defaults_env", gym_id="CartPole-v1", defaults={"algo": {"group_sise": 4}})
    message = error_of(resolve, ["env=bad_defaults_env"])
    assert "bad_defaults_env" in message and "group_sise" in message


def test_env_defaults_are_validated_too(registry_sandbox, resolve) -> None:
    register_env("tiny_group_env", gym_id="CartPole-v1", defaults={"algo": {"group_size": 1}})
    assert "algo.group_size=1" in error_of(resolve, ["env=tiny_group_env"])
    assert resolve(["env=tiny_group_env", "algo.group_size=2"]).algo.group_size == 2


# --------------------------------------------------------------------------- through the CLI
def test_cli_typo_exits_nonzero_naming_the_key(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "typo"
    proc = run_cli("env=cartpole", "algo.grup_size=8", run_dir=run_dir, check=False)
    assert proc.returncode != 0
    assert "grup_size" in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists()


def test_cli_invalid_value_fails_before_training(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "invalid"
    proc = run_cli("env=cartpole", "algo.group_size=1", "algo.lr=0", run_dir=run_dir, check=False)
    assert proc.returncode == 2
    assert "algo.group_size=1" in proc.stderr and "algo.lr=0" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()


def test_added_unknown_key_is_rejected_with_a_suggestion(run_cli):
    """Hydra's own hint for a typo is `+key=...`; following it must not silently add a dead key."""
    proc = run_cli("env=cartpole", "+algo.grup_size=3", "total_steps=100", check=False)
    assert proc.returncode == 2
    assert "unknown key algo.grup_size" in proc.stderr
    assert "did you mean algo.group_size" in proc.stderr
