"""The ``marl_extra`` suite (butterfly/sisl, issue 13) plugs into the harness: a ``--smoke`` run of
GRPO, MAPPO and IPPO on knights_archers_zombies (vector obs, the cheapest env) writes the table and
results.json with one row per algorithm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.run import main
from benchmarks.suites import get_suite
from tests.conftest import needs

#: what the suite's envs import (PettingZoo's butterfly/sisl families): the marl-extra extra
MARL_EXTRA = ("supersuit", "pymunk", "Box2D", "pygame")

ALGOS = ["grpo", "mappo", "ippo"]


def test_marl_extra_suite_definition() -> None:
    suite = get_suite("marl_extra")
    assert suite.algos == ALGOS and suite.target == "grpo" and suite.references == ["mappo", "ippo"]
    assert [e.env for e in suite.envs] == ["knights_archers_zombies", "multiwalker", "cooperative_pong", "pistonball"]
    for entry in suite.envs:
        budgets = {entry.total_steps[a] for a in ALGOS}
        assert len(budgets) == 1, f"{entry.env}: unequal env-step budgets {entry.total_steps}"
        assert entry.threshold is None and entry.smoke_steps < entry.eval_every


@needs(*MARL_EXTRA, "matplotlib", extra="bench")  # the envs and the report
def test_marl_extra_smoke_one_row_per_algo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = get_suite("marl_extra")
    entry = suite.env("knights_archers_zombies")
    # Smaller updates than the tuned ones (GRPO: 4 episodes; PPO: 2 envs x 128 steps) and 2-episode
    # evaluations keep the three subprocesses well under a minute on a loaded 2-core machine.
    monkeypatch.setattr(suite, "eval_episodes", 2)
    monkeypatch.setattr(
        entry,
        "overrides",
        {
            "grpo": ["algo.num_groups=1"],
            "mappo": ["algo.n_envs=2", "algo.batch_size=256"],
            "ippo": ["algo.n_envs=2", "algo.batch_size=256"],
        },
    )
    monkeypatch.setattr(entry, "smoke_steps", 256)
    monkeypatch.setattr(entry, "smoke_eval_every", 256)
    payload = main(
        [
            "--suite",
            "marl_extra",
            "--smoke",
            "--envs",
            "knights_archers_zombies",
            "--algos",
            *ALGOS,
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    out = tmp_path / "marl_extra-smoke"
    assert payload["meta"]["status"] == {f"knights_archers_zombies/{a}/seed1": "ok" for a in ALGOS}
    table = (out / "table.md").read_text()
    assert "SMOKE" in table
    main_table = table.split("## grpo relative to")[0]  # the ratio tables repeat the env label
    rows = [line for line in main_table.splitlines() if line.startswith("| butterfly knights_archers_zombies_v11")]
    assert sorted(line.split("|")[2].strip() for line in rows) == sorted(ALGOS)
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["rows"]) == sorted(f"knights_archers_zombies/{a}" for a in ALGOS)
    for algo in ALGOS:
        r = results["rows"][f"knights_archers_zombies/{algo}"]
        assert r["seeds"] == [1] and r["threshold"] is None and r["per_seed"]["1"]["env_steps"] >= 256


@needs("supersuit", "pygame", extra="marl-extra")
def test_env_speed_measures_the_three_builds() -> None:
    """``python -m benchmarks.marl_extra speed`` reports steps/s of the bare env, SuperSuit on the
    Parallel env and ``preprocess.apply``, measured in one run (the ratio is the speedup)."""
    from benchmarks.marl_extra import env_speed

    (row,) = env_speed(["cooperative_pong"], seconds=0.3)
    labels = ["bare parallel env (no preprocessing)", "SuperSuit on the Parallel env", "grpo_marl preprocess.apply"]
    assert all(row[k] > 0 for k in labels)
    assert row["speedup"] == round(row[labels[2]] / row[labels[1]], 2)
    assert row["preprocess"]["frame_stack"] == 4 and row["preprocess"]["resize"] == [48, 48]
