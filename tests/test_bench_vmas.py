"""The ``vmas`` benchmark suite: ours vs BenchMARL's MAPPO/IPPO, without BenchMARL installed here.

BenchMARL runs under its own virtualenv's python (``benchmarks/benchmarl_runner.py``); these tests
check what the harness does on our side: the suite and its jobs, the peer's command line (built
from our resolved task parameters), the threshold taken from BenchMARL MAPPO's median final
return, and the one-line refusals when the peer's virtualenv cannot be made or used.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import benchmarks.runners as runners
import benchmarks.suites.vmas as vmas_suite
from benchmarks import benchmarl_runner
from benchmarks.peer_venv import PeerVenv
from benchmarks.report import aggregate, reference_threshold, table_markdown, write_report
from benchmarks.run import main, plan, prepare_runners
from benchmarks.runners import RUNNER_PREPARE, RUNNERS, Job
from benchmarks.suites import get_suite
from tests.conftest import ROOT, needs

ENVS = ["balance", "navigation", "sampling", "transport", "wheel"]
ALGOS = ["grpo", "mappo", "ippo", "benchmarl_mappo", "benchmarl_ippo"]
#: BenchMARL 1.5.2's task YAML for vmas/balance, plus continuous actions
BALANCE = {
    "max_steps": 100,
    "n_agents": 4,
    "random_package_pos_on_line": True,
    "package_mass": 5,
    "continuous_actions": True,
}


@pytest.fixture
def peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """BENCHMARL_VENV at a folder of this test; our task parameters for balance stubbed."""
    venv = tmp_path / "peer"
    monkeypatch.setenv("BENCHMARL_VENV", str(venv))
    monkeypatch.setattr(vmas_suite, "our_env_kwargs", lambda env: dict(BALANCE))
    return venv


def test_the_suite_registers_its_tasks_algorithms_and_reference() -> None:
    suite = get_suite("vmas")
    assert [e.env for e in suite.envs] == ENVS and suite.algos == ALGOS
    assert suite.threshold_from == "benchmarl_mappo" and suite.step_unit == "frames"
    assert suite.target == "grpo" and set(suite.references) == set(ALGOS) - {"grpo"}
    assert all(a in RUNNERS for a in ALGOS)
    # the peers get their venv ready before any job; ours need nothing of the kind
    assert RUNNER_PREPARE["benchmarl_mappo"] is RUNNER_PREPARE["benchmarl_ippo"]
    assert not any(a in RUNNER_PREPARE for a in ("grpo", "mappo", "ippo"))
    assert set(suite.needs) <= set(runners.PACKAGE_OF)
    for entry in suite.envs:  # one budget and cadence for every algorithm, BenchMARL-compatible
        assert set(entry.total_steps.values()) == {vmas_suite.FRAMES} and set(entry.total_steps) == set(ALGOS)
        assert entry.eval_every % vmas_suite.BATCH["frames_per_batch"] == 0
        assert vmas_suite.FRAMES % entry.eval_every == 0
        assert entry.smoke_eval_every % vmas_suite.SMOKE_BATCH["frames_per_batch"] == 0
        assert entry.smoke_steps % entry.smoke_eval_every == 0


def test_the_jobs_plan_seed_major_over_tasks_and_algorithms(tmp_path: Path) -> None:
    suite = get_suite("vmas")
    jobs = plan(suite, tmp_path, [1, 2, 3], None, None, False, False)
    assert len(jobs) == 3 * 5 * 5
    assert [j.key for j in jobs[:6]] == [f"balance/{a}/seed1" for a in ALGOS] + ["navigation/grpo/seed1"]
    assert {j.total_steps for j in jobs} == {vmas_suite.FRAMES}
    assert jobs[-1].run_dir == tmp_path / "runs" / "wheel" / "benchmarl_ippo" / "seed3"


def test_ours_run_through_the_cli_with_the_same_budget_and_evaluation(tmp_path: Path) -> None:
    suite = get_suite("vmas")
    for algo in ("grpo", "mappo", "ippo"):
        argv = RUNNERS[algo](Job(suite, suite.env("balance"), algo, 2, tmp_path / algo))
        assert argv[1:3] == ["-m", "grpo_marl.train"]
        for arg in ("env=balance", f"algo={algo}", "seed=2", "total_steps=36000", "eval.every_steps=6000"):
            assert arg in argv
        assert f"eval.episodes={vmas_suite.EVAL_EPISODES}" in argv


def test_the_peer_command_line_carries_our_task_parameters_and_budget(tmp_path: Path, peer: Path) -> None:
    suite = get_suite("vmas")
    job = Job(suite, suite.env("balance"), "benchmarl_mappo", 3, tmp_path / "run")
    argv = RUNNERS["benchmarl_mappo"](job)
    assert argv[0] == str(peer / "bin" / "python")  # the peer's interpreter, not ours
    assert Path(argv[1]) == ROOT / "benchmarks" / "benchmarl_runner.py"
    a = benchmarl_runner.parse(argv[2:])  # what the runner will see, its own checks included
    assert (a.task, a.env, a.algo, a.seed, a.run_dir) == ("balance", "balance", "mappo", 3, tmp_path / "run")
    assert json.loads(a.task_kwargs) == BALANCE
    assert (a.max_frames, a.eval_every, a.eval_episodes) == (36_000, 6_000, vmas_suite.EVAL_EPISODES)
    assert (a.frames_per_batch, a.n_envs, a.minibatch_size) == (6_000, 60, 400)
    assert a.minibatch_iters is None and a.lr is None and a.gamma is None  # BenchMARL's VMAS values

    ippo = benchmarl_runner.parse(RUNNERS["benchmarl_ippo"](job)[2:])
    assert ippo.algo == "ippo"
    smoke = benchmarl_runner.parse(RUNNERS["benchmarl_mappo"](Job(suite, job.entry, "x", 1, tmp_path, smoke=True))[2:])
    assert (smoke.max_frames, smoke.eval_every, smoke.frames_per_batch, smoke.n_envs) == (2_400, 1_200, 1_200, 12)
    assert vmas_suite.scenario("vmas:flocking") == "flocking" and vmas_suite.scenario("wheel") == "wheel"


def test_an_env_our_config_cannot_resolve_fails_its_job_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unknown(env: str) -> dict:
        raise KeyError(f"unknown env {env!r}")

    monkeypatch.setattr(vmas_suite, "our_env_kwargs", unknown)
    suite = get_suite("vmas")
    argv = RUNNERS["benchmarl_mappo"](Job(suite, suite.env("wheel"), "benchmarl_mappo", 1, tmp_path))
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stderr == "error: could not resolve our env_kwargs for env=wheel: KeyError: \"unknown env 'wheel'\"\n"


def test_the_runner_refuses_budgets_benchmarl_cannot_evaluate_on(tmp_path: Path) -> None:
    base = ["--task", "balance", "--algo", "mappo", "--task-kwargs", "{}", "--run-dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        benchmarl_runner.parse(
            [*base, "--max-frames", "9000", "--frames-per-batch", "6000", "--n-envs", "60"] + ["--eval-every", "6000"]
        )


def test_the_runner_imports_neither_grpo_marl_nor_the_harness() -> None:
    """It runs under the peer's python, where neither is installed."""
    tree = ast.parse((ROOT / "benchmarks" / "benchmarl_runner.py").read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [m for m in modules if m.split(".")[0] in ("grpo_marl", "benchmarks", "tests")]


def _run(tmp_path: Path, env: str, algo: str, seed: int, curve: list[tuple[int, float, float]], final: float | None):
    """A run dict as ``read_run`` gives it; ``final`` None = cut by the budget (no summary)."""
    points = [{"step": s, "wall_s": w, "train_s": w, "return": r, "return_std": 0.1} for s, r, w in curve]
    summary = None
    if final is not None:
        summary = {
            "status": "completed",
            "eval/return_mean": final,
            "eval/return_std": 0.1,
            "env_steps": curve[-1][0],
            "wall_seconds": curve[-1][2],
            # what the runners know (no threshold of theirs): never used by this suite's table
            "steps_to_threshold": None,
            "time_to_threshold_s": None,
            "train_time_to_threshold_s": None,
        }
    return {"curve": points, "summary": summary}


def _hand_made_runs(tmp_path: Path) -> dict:
    runs = {}
    # BenchMARL MAPPO finals -2.0, -1.0, -1.5: the threshold is their median, -1.5
    for seed, final in ((1, -2.0), (2, -1.0), (3, -1.5)):
        curve = [(6_000, -3.0, 20.0), (12_000, -2.5, 40.0), (18_000, final, 60.0)]
        runs[("balance", "benchmarl_mappo", seed)] = _run(tmp_path, "balance", "benchmarl_mappo", seed, curve, final)
    # ours reaches -1.5 at 12,000 frames (seeds 1, 2) and never (seed 3): median 12,000 frames
    for seed, (r2, r3) in ((1, (-1.4, -1.2)), (2, (-1.5, -1.6)), (3, (-2.0, -1.9))):
        curve = [(6_000, -2.5, 5.0), (12_000, r2, 10.0), (18_000, r3, 15.0)]
        runs[("balance", "grpo", seed)] = _run(tmp_path, "balance", "grpo", seed, curve, r3)
    # a run cut by the budget: its curve counts, its last point is its final
    runs[("balance", "benchmarl_ippo", 1)] = _run(tmp_path, "balance", "benchmarl_ippo", 1, [(6_000, -1.2, 30.0)], None)
    return runs


def test_the_threshold_is_the_reference_algorithms_median_final(tmp_path: Path) -> None:
    suite = get_suite("vmas")
    runs = _hand_made_runs(tmp_path)
    assert reference_threshold(suite, "balance", runs) == -1.5
    assert reference_threshold(suite, "wheel", runs) is None  # no reference runs there
    agg = aggregate(suite, runs)
    ref, grpo, ippo = (agg["rows"][f"balance/{a}"] for a in ("benchmarl_mappo", "grpo", "benchmarl_ippo"))
    assert ref["threshold"] == grpo["threshold"] == ippo["threshold"] == -1.5
    # frames / seconds to it from each run's curve (finals included), the runner's own None ignored
    assert [ref["per_seed"][s]["steps_to_threshold"] for s in (1, 2, 3)] == [None, 18_000, 18_000]
    assert ref["steps_to_threshold"]["median"] == 18_000 and ref["steps_to_threshold"]["reached"] == 2
    assert [grpo["per_seed"][s]["steps_to_threshold"] for s in (1, 2, 3)] == [12_000, 12_000, None]
    assert grpo["steps_to_threshold"]["median"] == 12_000 and grpo["time_to_threshold_s"]["median"] == 10.0
    assert ippo["steps_to_threshold"]["median"] == 6_000 and ippo["finished"] == 0
    assert grpo["final_return_median"] == -1.6 and ref["final_return_median"] == -1.5
    assert grpo["env_steps_median"] == 18_000 and grpo["sps_median"] == 18_000 / 15.0
    assert agg["ratios"]["balance"]["benchmarl_mappo"]["steps"] == pytest.approx(12_000 / 18_000)
    assert agg["ratios"]["balance"]["benchmarl_mappo"]["wall"] == pytest.approx(10.0 / 60.0)

    meta = {"seeds": [1, 2, 3], "jobs": 2, "cpus": 2, "smoke": False, "generated": "now"}
    table = table_markdown(suite, agg, meta, [])
    assert "| env | algo | threshold (benchmarl_mappo final) | frames to threshold |" in table
    assert "median over seeds of benchmarl_mappo's final greedy eval" in table
    row = next(line for line in table.splitlines() if line.startswith("| vmas balance (4 agents) | grpo |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "-1.50" and cells[3] == "12,000 [12,000-not reached] (2/3)"
    assert cells[6] == "-1.60 [-1.90, -1.20] at 18,000" and cells[7] == "1,200"


@needs("matplotlib", extra="bench")
def test_the_report_draws_the_reference_threshold(tmp_path: Path) -> None:
    suite = get_suite("vmas")
    meta = {"seeds": [1, 2, 3], "jobs": 2, "cpus": 2, "smoke": False, "generated": "now"}
    payload = write_report(suite, tmp_path, _hand_made_runs(tmp_path), meta)
    assert payload["plots"] == ["curves_balance.png"]
    assert payload["rows"]["balance/grpo"]["threshold_from"] == "benchmarl_mappo"


def _fake_python(path: Path, code: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexit {code}\n")
    path.chmod(0o755)


def test_a_peer_venv_that_cannot_be_made_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real failure, no network: the venv's folder would be inside a regular file."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv("BENCHMARL_VENV", str(blocker / "venv"))
    monkeypatch.setattr(runners, "installed", lambda module: True)  # vmas (our env family) present
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["--suite", "vmas", "--smoke", "--envs", "balance", "--seeds", "1", "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith(
        f"error: the benchmarl peer virtualenv at {blocker / 'venv'} could not be made"
    )
    assert "set BENCHMARL_VENV to a virtualenv with benchmarl==1.5.2 vmas==1.5.2" in err[0]
    assert err[1] == "(or leave out benchmarl_mappo, benchmarl_ippo: --algos grpo mappo ippo)"
    assert not out.exists()  # refused before anything is written


def test_only_requested_peers_are_prepared_and_report_only_prepares_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for algo in ("benchmarl_mappo", "benchmarl_ippo"):
        monkeypatch.setitem(RUNNER_PREPARE, algo, lambda: pytest.fail("prepared a peer that was not asked for"))
    assert prepare_runners(["grpo", "mappo", "ippo"]) is None  # ours alone: no peer to make
    with pytest.raises(SystemExit, match="no finished runs"):  # not the peer's refusal (exit 2)
        main(["--suite", "vmas", "--report-only", "--out", str(tmp_path)])


def test_a_failing_install_step_names_itself_and_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCHMARL_VENV_TEST", str(tmp_path / "peer"))
    venv = PeerVenv(
        "benchmarl", "BENCHMARL_VENV_TEST", ("benchmarl==1.5.2", "vmas==1.5.2"), ("benchmarl",), ("torch==2.13.0",)
    )
    steps: list[list[str]] = []

    def run(argv: Sequence[str], log: Path) -> int:
        steps.append(list(argv))
        if argv[1:3] == ["-m", "venv"]:
            _fake_python(Path(argv[3]) / "bin" / "python", code=1)  # a python that lacks benchmarl
            return 0
        log.write_text(log.read_text() + "ERROR: No matching distribution found for torch==2.13.0\n")
        return 1

    why = venv.ensure(run=run, announce=lambda line: None)
    assert [s[1:3] for s in steps] == [["-m", "venv"], ["-m", "pip"]]
    assert steps[0][0] == sys.executable and steps[1][-1] == "torch==2.13.0"  # the project's torch pin first
    assert why == (
        f"the benchmarl peer virtualenv at {tmp_path / 'peer'} could not be made: `python -m pip install -q "
        "torch==2.13.0` exited 1 (ERROR: No matching distribution found for torch==2.13.0); see "
        f"{tmp_path / 'peer.install.log'}, or set BENCHMARL_VENV_TEST to a virtualenv with benchmarl==1.5.2 vmas==1.5.2"
    )


def test_a_venv_without_the_packages_is_refused_after_installing(tmp_path: Path, peer: Path) -> None:
    """A python that lacks benchmarl (here: the project's own) stays refused if pip did not help."""
    (peer / "bin").mkdir(parents=True)
    (peer / "bin" / "python").symlink_to(sys.executable)
    assert "No module named 'benchmarl'" in (vmas_suite.BENCHMARL.missing() or "")
    steps: list[list[str]] = []
    why = vmas_suite.BENCHMARL.ensure(run=lambda argv, log: steps.append(list(argv)) or 0, announce=lambda line: None)
    assert [s[-1] for s in steps] == ["torch==2.13.0", "vmas==1.5.2"]  # no venv step: it exists
    assert why is not None and "is not usable after installing: ModuleNotFoundError: No module named 'benchmarl'" in why


def test_a_ready_venv_is_used_as_it_is(tmp_path: Path, peer: Path) -> None:
    _fake_python(peer / "bin" / "python")  # its checks pass
    assert vmas_suite.BENCHMARL.ensure(run=lambda argv, log: pytest.fail(f"ran {argv}")) is None
    assert vmas_suite.prepare_benchmarl() is None


def test_the_default_venv_lives_in_the_repository_and_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCHMARL_VENV", raising=False)
    assert vmas_suite.BENCHMARL.path == ROOT / ".peers" / "benchmarl"
    assert ".peers/" in (ROOT / ".gitignore").read_text().splitlines()


def test_benchmarl_gets_exactly_our_resolved_env_kwargs() -> None:
    """Once the vmas env family is registered: BenchMARL 1.5.2's task values, continuous actions."""
    from grpo_marl.registry import get_spec

    try:
        get_spec("balance")
    except Exception:
        pytest.skip("the vmas env family is not registered in this checkout")
    assert vmas_suite.our_env_kwargs("balance") == BALANCE
