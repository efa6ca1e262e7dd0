"""Proof from outside (issue 24 item 7): tests/outside_pkg is a user's package, found on the path
like any installed one, that adds a loss (CISPO) and an aggregation through entry points; the
CLI and ``fit()`` train with them without any edit to grpo_marl. docs/ARCHITECTURE.md's "How to
add a loss / an aggregation" recipes are these steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, _subprocess_env

OUTSIDE = Path(__file__).parent / "outside_pkg"
TINY = ["env=cartpole", "total_steps=2000", "algo.num_groups=2", "algo.group_size=4", "eval.episodes=2"]


def _env(*extra_paths: Path) -> dict[str, str]:
    env = _subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_paths), str(OUTSIDE), env["PYTHONPATH"]])
    return env


def _train(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    run_dir = tmp_path / "run"
    args = [*TINY, *overrides, f"hydra.run.dir={run_dir}", "log.progress=false"]
    return subprocess.run(
        [sys.executable, "-m", "grpo_marl.train", *args],
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
    )


def test_cispo_objective_is_the_clipped_is_weighted_reinforce() -> None:
    sys.path.insert(0, str(OUTSIDE))
    try:
        from grpo_marl_outside import CISPOLoss
    finally:
        sys.path.remove(str(OUTSIDE))
    loss = CISPOLoss(clip_eps_low=0.2, clip_eps_high=0.2)
    logp = torch.tensor([0.5, -1.0], requires_grad=True)
    old = torch.tensor([0.0, -1.0])
    adv, w = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.5])
    out = loss(logp, old, adv, w)
    out["loss"].backward()
    # token 0: r = e^0.5 > 1.2, weight clipped to 1.2; token 1: r = 1 -> weight 1
    assert out["loss_policy"].item() == pytest.approx(-(0.5 * 1.2 * 1.0 * 0.5 + 0.5 * 1.0 * -2.0 * -1.0))
    # the clipped token keeps its gradient (CISPO's point): d/dlogp = -w * weight * A
    assert logp.grad.tolist() == pytest.approx([-0.5 * 1.2 * 1.0, -0.5 * 1.0 * -2.0])


def test_cli_trains_with_the_outside_loss_and_aggregation(tmp_path: Path) -> None:
    proc = _train(tmp_path, "algo.loss=cispo", "algo.aggregation=row_mean")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    resolved = (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert "loss: cispo" in resolved and "aggregation: row_mean" in resolved


def test_unregistered_loss_is_refused_naming_the_registered_ones(tmp_path: Path) -> None:
    proc = _train(tmp_path, "algo.loss=cispo", env=_subprocess_env())  # the package not on the path
    assert proc.returncode == 2
    assert "cispo" in proc.stderr and "gspo" in proc.stderr


def test_a_broken_plugin_does_not_break_a_run_that_does_not_use_it(tmp_path: Path) -> None:
    broken = tmp_path / "site"
    (broken / "broken_plugin-0.1.dist-info").mkdir(parents=True)
    (broken / "broken_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: broken_plugin\nVersion: 0.1\n"
    )
    (broken / "broken_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[grpo_marl.losses]\nbroken = no_such_module_xyz:Loss\n"
    )
    proc = _train(tmp_path, "algo.loss=cispo", env=_env(broken))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'broken'" in proc.stderr and "no_such_module_xyz" in proc.stderr  # named in a warning
    asked = _train(tmp_path / "b", "algo.loss=broken", env=_env(broken))
    assert asked.returncode == 2
    assert "no_such_module_xyz" in asked.stderr  # the error names why the plugin is missing


def test_fit_trains_with_the_outside_loss(tmp_path: Path) -> None:
    code = (
        "import grpo_marl, json, sys; "
        f"r = grpo_marl.fit('cartpole', run_dir={str(tmp_path / 'fit')!r}, total_steps=2000, "
        "algo={'num_groups': 2, 'group_size': 4, 'loss': 'cispo', 'aggregation': 'row_mean'}, "
        "eval={'episodes': 2}, log={'progress': False}); print(json.dumps(r.summary['status']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == '"completed"'
