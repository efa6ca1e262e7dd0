"""A user's input reaches the config as given, and a mistake in it is named before anything runs.

The Python API (``fit``'s nested dicts, its key suggestions, ``act()``'s observation checks), a
user's own Hydra config file (``--config-dir D --config-name exp``: it wins over the env's tuned
defaults, the command line wins over it) and setup-time refusals (a config-group switch on
resume, agents of one group with different spaces, a ParallelEnv factory that does not say so):
each CLI case runs the real command in a subprocess from an empty folder, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

import grpo_marl
from grpo_marl.errors import UserInputError
from tests import custom_envs
from tests.conftest import _subprocess_env
from tests.test_cli_refusals import tree

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["log.progress=false", "eval.episodes=2"]


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = _subprocess_env()
    env["PYTHONPATH"] = f"{ROOT}:{env.get('PYTHONPATH', '')}"
    return subprocess.run(
        [sys.executable, "-m", "grpo_marl.train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def saved(run_dir: Path) -> dict:
    return OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))  # type: ignore[return-value]


# -- fit() --------------------------------------------------------------------------------------------
def test_fit_passes_env_kwargs_and_dicts_hydra_cannot_write_to_the_factory(tmp_path: Path) -> None:
    labels = {"mypkg.rewards:f": 1.0, "plain": 0.5}  # a key with a colon: not in Hydra's grammar
    custom_envs.SEEN_KWARGS.clear()
    result = grpo_marl.fit(
        "tests.custom_envs:sized_bandit",
        env_kwargs={"size": 3, "labels": labels},
        total_steps=64,
        vec={"max_steps": 1},
        log={"progress": False},
        eval={"episodes": 2},
        run_dir=tmp_path / "run",
    )
    assert result.summary["status"] == "completed"
    assert {"size": 3, "labels": labels} in custom_envs.SEEN_KWARGS
    assert saved(result.run_dir)["env_kwargs"] == {"size": 3, "labels": labels}
    actions = result.load().act(np.zeros((64, 1), np.float32))
    assert set(actions.tolist()) <= {0, 1, 2}


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"totl_steps": 5}, "unknown key totl_steps (did you mean total_steps?)"),
        ({"algo": {"lrr": 1e-3}}, "unknown key algo.lrr (did you mean algo.lr?)"),
        ({"algo": "grpoo"}, "algo=grpoo is not a config option; choose one of grpo, ippo, mappo, ppo"),
    ],
)
def test_fit_names_a_misspelt_key_as_the_cli_does(tmp_path: Path, overrides: dict, message: str) -> None:
    with pytest.raises(UserInputError) as info:
        grpo_marl.fit("cartpole", run_dir=tmp_path / "run", **overrides)
    assert message in str(info.value) and "+" not in str(info.value).split("\n", 1)[1]
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def cartpole_policy(tmp_path_factory: pytest.TempPathFactory) -> grpo_marl.TrainedPolicy:
    run = tmp_path_factory.mktemp("act") / "run"
    return grpo_marl.fit(
        "cartpole", total_steps=1000, log={"progress": False}, eval={"episodes": 2}, run_dir=run
    ).load()


def test_act_refuses_an_observation_of_the_wrong_shape(cartpole_policy: grpo_marl.TrainedPolicy) -> None:
    with pytest.raises(UserInputError) as info:
        cartpole_policy.act(np.zeros(3, np.float32))  # was: a batch of 3 actions, [1, 1, 1]
    assert str(info.value) == (
        "the observation has shape (3,); this policy expects shape (4,), or a batch of shape (N, 4) "
        "(its observation space is Box(shape=(4,), dtype=float32))"
    )
    with pytest.raises(UserInputError, match=r"has shape \(2, 3\); this policy expects shape \(4,\)"):
        cartpole_policy.act(np.zeros((2, 3), np.float32))
    with pytest.raises(UserInputError, match="has dtype <U1; expected numbers of shape"):
        cartpole_policy.act(np.array(list("abcd")))
    assert cartpole_policy.act(np.zeros((5, 4), np.float32)).shape == (5,)  # a batch is fine


# -- the CLI: a user's config file ---------------------------------------------------------------------
def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)
    return folder


EXP = "defaults:\n  - config\n  - _self_\ntotal_steps: 3000\nalgo:\n  lr: 0.001\n  epochs: 1\n"


def test_a_user_config_file_wins_over_env_defaults_and_the_command_line_over_it(tmp_path: Path) -> None:
    cfgs = write(tmp_path / "cfgs", "exp", EXP)
    run = tmp_path / "run"
    # cartpole's tuned GRPO defaults say total_steps 300000, lr 0.002, epochs 2: the file wins
    proc = cli(
        tmp_path, "--config-dir", str(cfgs), "--config-name", "exp", "algo.epochs=3", f"hydra.run.dir={run}", *QUIET
    )
    assert proc.returncode == 0, proc.stderr
    cfg = saved(run)
    assert (cfg["total_steps"], cfg["algo"]["lr"], cfg["algo"]["epochs"]) == (3000, 0.001, 3)
    assert cfg["algo"]["group_size"] == 8  # a key the file leaves to the env's tuned defaults
    # the same command again with resume=: the file's values are the run's own, not changes
    again = cli(tmp_path, "-cd", str(cfgs), "-cn", "exp", "algo.epochs=3", f"resume={run}", "total_steps=9000", *QUIET)
    assert again.returncode == 0, again.stderr
    assert json.loads((run / "summary.json").read_text())["env_steps"] >= 9000


def test_a_user_config_file_selects_config_groups(tmp_path: Path) -> None:
    cfgs = write(
        tmp_path / "cfgs", "ppo_exp", "defaults:\n  - config\n  - override algo: ppo\n  - _self_\ntotal_steps: 512\n"
    )
    run = tmp_path / "run"
    proc = cli(tmp_path, f"--config-dir={cfgs}", "--config-name=ppo_exp", f"hydra.run.dir={run}", *QUIET)
    assert proc.returncode == 0, proc.stderr
    cfg = saved(run)
    assert cfg["algo"]["name"] == "ppo" and cfg["total_steps"] == 512
    assert cfg["algo"]["n_envs"] == 8  # cartpole's tuned PPO defaults under the file


@pytest.mark.parametrize(
    "text, message",
    [
        # a flat file (no defaults list): was exit 1, "unexpected ConfigAttributeError"
        ("total_steps: 3000\n", "does not build on grpo_marl's config"),
        (
            "defaults: [config, _self_]\ntotl_steps: 5\nalgo:\n  lrr: 1\n",
            "unknown key algo.lrr (did you mean algo.lr?)",
        ),
        ("defaults: [config, _self_]\nalgo:\n  lr: 0\n", "algo.lr=0 must be > 0"),
        ("defaults: [config, _self_]\ntotal_steps: [3\n", "is not a valid YAML config"),
    ],
)
def test_a_wrong_config_file_is_refused_naming_it_and_writes_nothing(tmp_path: Path, text: str, message: str) -> None:
    cfgs = write(tmp_path / "cfgs", "exp", text)
    work = tmp_path / "work"
    work.mkdir()
    proc = cli(work, "--config-dir", str(cfgs), "--config-name", "exp", *QUIET)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert "exp.yaml" in proc.stderr or "algo.lr=0" in proc.stderr
    assert tree(work) == {}


def test_a_config_name_that_does_not_exist_is_named(tmp_path: Path) -> None:
    proc = cli(tmp_path, "--config-dir", str(tmp_path), "--config-name", "nope", *QUIET)
    assert proc.returncode == 2
    assert f"--config-name nope: no nope.yaml in {tmp_path}" in proc.stderr
    assert tree(tmp_path) == {}


# -- the CLI: refusals found at setup ------------------------------------------------------------------
def test_resume_refuses_a_config_group_switch_and_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert cli(tmp_path, "env=cartpole", "total_steps=600", f"hydra.run.dir={run}", *QUIET).returncode == 0
    before = tree(run)
    proc = cli(tmp_path, f"resume={run}", "algo=ppo", *QUIET)  # was silently ignored
    assert proc.returncode == 2
    assert f"algo=ppo cannot change when resuming: {run} was trained with algo=grpo" in proc.stderr
    assert tree(run) == before
    same = cli(tmp_path, f"resume={run}", "algo=grpo", "algo.lr=0.1", *QUIET)  # a changed key: named with both values
    assert same.returncode == 2 and "algo.lr cannot change when resuming: the run has algo.lr=" in same.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["env=simple_speaker_listener", "++marl.groups.speaker_0=all", "++marl.groups.listener_0=all"],
            "agents of group 'all' have different spaces",
        ),
        (["env=tests.custom_envs:spread_without_kind"], "grpo_marl_kind"),
    ],
)
def test_setup_input_errors_exit_2_and_write_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    proc = cli(tmp_path, *args, "total_steps=100", *QUIET)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "unexpected" not in proc.stderr and "Traceback" not in proc.stderr
    assert tree(tmp_path) == {}
