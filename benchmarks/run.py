"""Run a benchmark suite (algorithms x envs x seeds) in parallel processes and write its report.

    python -m benchmarks.run --suite classic --seeds 3 --jobs 2 --budget-minutes 60
    python -m benchmarks.run --suite classic --envs cartpole pendulum --seeds 3
    python -m benchmarks.run --suite classic --smoke --envs cartpole --algos ppo --seeds 1
    python -m benchmarks.run --suite text --seeds 3 --jobs 2     # our GRPO vs TRL's GRPOTrainer
    python -m benchmarks.run --suite vmas --seeds 3 --jobs 2     # ours vs BenchMARL's MAPPO/IPPO

Each job is one subprocess (the grpo_marl CLI, ``benchmarks.sb3_ppo`` or ``benchmarks.trl_runner``)
pinned to one torch thread, ``--jobs`` of them at a time (default: one per CPU core). Its run directory is
``<out>/<suite>/runs/<env>/<algo>/seed<k>`` and its stdout/stderr go to ``runner.log`` there.
Finished runs (``summary.json`` present) are reused, so a suite can be filled in over several
invocations (``--force`` reruns them). ``--budget-minutes`` is a wall-clock budget for the whole
invocation: jobs not started by then are skipped, running ones are stopped and contribute their
partial curves (marked "cut by budget" in the table). The report is rebuilt from every run
directory of the suite: ``table.md``, ``results.json`` and ``curves_<env>.png``.

Before any job starts, a suite whose packages are not installed (matplotlib for the report, the
suite's envs' packages, a requested peer's SB3 or TRL) is refused with exit code 2, naming them
and ``pip install -e ".[bench]"``; nothing is written. A requested peer that runs under its own
virtualenv (BenchMARL, ``benchmarks/suites/vmas.py``) has it made then, once (``RUNNER_PREPARE``);
if that fails, the same exit code 2 with one line saying why.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.report import read_run, write_report
from benchmarks.runners import (
    BENCH_INSTALL,
    INSTALL_OUTSIDE_BENCH,
    RUNNER_NEEDS,
    RUNNER_PREPARE,
    RUNNERS,
    Job,
    available,
    missing,
)
from benchmarks.suites import Suite, get_suite

REPO = Path(__file__).resolve().parents[1]


def requested_algos(suite: Suite, algos: list[str] | None) -> list[str]:
    """``algos`` (default: the suite's), each checked to be one of the suite's."""
    algos = algos or suite.algos
    unknown = [a for a in algos if a not in suite.algos]
    if unknown:
        raise SystemExit(f"algorithms {unknown} are not in suite {suite.name!r} ({suite.algos})")
    return algos


def plan(
    suite: Suite,
    out: Path,
    seeds: list[int],
    envs: list[str] | None,
    algos: list[str] | None,
    smoke: bool,
    stop_on_threshold: bool,
) -> list[Job]:
    """Jobs ordered seed-major, so a budget cut leaves complete seeds rather than complete envs."""
    entries = [suite.env(e) for e in envs] if envs else suite.envs
    algos = requested_algos(suite, algos)
    return [
        Job(suite, entry, algo, seed, out / "runs" / entry.env / algo / f"seed{seed}", smoke, stop_on_threshold)
        for seed in seeds
        for entry in entries
        for algo in algos
    ]


def check_packages(suite: Suite, algos: list[str], report_only: bool = False) -> str | None:
    """Why the suite cannot run here (None when it can): the packages that are not installed, what
    needs each, and the install command. The report's plots need matplotlib; the suite's envs and
    each requested algorithm's runner their own packages (``Suite.needs``, ``RUNNER_NEEDS``).
    ``--report-only`` runs nothing, so it needs only matplotlib."""
    needs: dict[str, list[str]] = {}  # package -> what needs it
    for package in missing(["matplotlib"]):
        needs.setdefault(package, []).append("the report's plots")
    peers = []  # requested algorithms that cannot run here
    if not report_only:
        for package in missing(suite.needs):
            needs.setdefault(package, []).append(f"the {suite.name} suite's envs")
        for algo in algos:
            for package in missing(RUNNER_NEEDS.get(algo, ())):
                needs.setdefault(package, []).append(algo)
                peers += [] if algo in peers else [algo]
    if not needs:
        return None
    listed = ", ".join(f"{package} ({', '.join(why)})" for package, why in needs.items())
    commands = [BENCH_INSTALL] if any(p not in INSTALL_OUTSIDE_BENCH for p in needs) else []
    commands += [INSTALL_OUTSIDE_BENCH[p] for p in needs if p in INSTALL_OUTSIDE_BENCH]
    lines = [f"error: --suite {suite.name} needs packages that are not installed: {listed}; {'; '.join(commands)}"]
    rest = [a for a in algos if a not in peers]
    if peers and rest and all(set(why) <= set(peers) for why in needs.values()):
        lines.append(f"(or leave out {', '.join(peers)}: --algos {' '.join(rest)})")
    return "\n".join(lines)


def prepare_runners(algos: list[str]) -> str | None:
    """Run each requested algorithm's ``prepare`` (:data:`RUNNER_PREPARE`: e.g. making a peer's
    own virtualenv) once; the first refusal, with the algorithms that can run without it, or None."""
    done: dict[Any, str | None] = {}
    for algo in algos:
        fn = RUNNER_PREPARE.get(algo)
        if fn is None:
            continue
        if fn not in done:
            done[fn] = fn()
        if done[fn]:
            blocked = [a for a in algos if RUNNER_PREPARE.get(a) is fn]
            rest = [a for a in algos if a not in blocked]
            hint = f"\n(or leave out {', '.join(blocked)}: --algos {' '.join(rest)})" if rest else ""
            return f"error: {done[fn]}{hint}"
    return None


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _why(job: Job) -> str:
    """The last ``error: ...`` line of a failed job's log (our CLI and the peers print one), if any."""
    try:
        lines = (job.run_dir / "runner.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.strip() for line in lines if line.startswith("error:")]
    return f": {errors[-1][len('error:') :].strip()}" if errors else ""


def execute(jobs: list[Job], n_parallel: int, budget_s: float | None, force: bool) -> dict[str, str]:
    """Run the jobs, ``n_parallel`` at a time; returns ``job.key -> status``."""
    status: dict[str, str] = {}
    pending = []
    for job in jobs:
        reason = available(job.algo)
        if reason:
            status[job.key] = f"skipped: {reason}"
            print(f"[bench] skip {job.key}: {reason}", flush=True)
        elif (job.run_dir / "summary.json").exists() and not force:
            status[job.key] = "reused"
        else:
            pending.append(job)
    deadline = None if budget_s is None else time.monotonic() + budget_s
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    running: list[tuple[Job, subprocess.Popen, float]] = []
    while pending or running:
        while pending and len(running) < n_parallel:
            job = pending.pop(0)
            if deadline is not None and time.monotonic() >= deadline:
                status[job.key] = "skipped: budget"
                continue
            if job.run_dir.exists():
                shutil.rmtree(job.run_dir)
            job.run_dir.mkdir(parents=True)
            argv = RUNNERS[job.algo](job)
            log = open(job.run_dir / "runner.log", "w")
            log.write(" ".join(argv) + "\n")
            log.flush()
            proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            log.close()
            running.append((job, proc, time.monotonic()))
            print(f"[bench] start {job.key}", flush=True)
        time.sleep(0.2)
        still = []
        for job, proc, t0 in running:
            rc = proc.poll()
            if rc is None:
                if deadline is not None and time.monotonic() >= deadline:
                    _stop(proc)
                    status[job.key] = "cut: budget"
                    print(f"[bench] cut   {job.key} (budget)", flush=True)
                else:
                    still.append((job, proc, t0))
                continue
            status[job.key] = "ok" if rc == 0 else f"failed (exit {rc}; see {job.run_dir / 'runner.log'})" + _why(job)
            print(f"[bench] done  {job.key}: {status[job.key]} in {time.monotonic() - t0:.1f} s", flush=True)
        running = still
    for job in pending:
        status.setdefault(job.key, "skipped: budget")
    return status


def collect_runs(suite: Suite, out: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    runs = {}
    for entry in suite.envs:
        for algo in suite.algos:
            base = out / "runs" / entry.env / algo
            if not base.exists():
                continue
            for d in sorted(base.glob("seed*")):
                run = read_run(d, entry.metric)
                if run["curve"] or run["summary"]:
                    runs[(entry.env, algo, int(d.name[4:]))] = run
    return runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description="Run a benchmark suite and write table.md, results.json, PNGs.")
    p.add_argument("--suite", default="classic")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds (1..N)")
    p.add_argument("--seed-list", type=int, nargs="*", help="explicit seeds (overrides --seeds)")
    p.add_argument("--envs", nargs="*", help="subset of the suite's envs")
    p.add_argument("--algos", nargs="*", help="subset of the suite's algorithms")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel jobs (default: CPU cores)")
    p.add_argument("--budget-minutes", type=float, default=None, help="wall-clock budget of this invocation")
    p.add_argument("--smoke", action="store_true", help="tiny budgets: checks the pipeline, measures nothing")
    p.add_argument("--stop-on-threshold", action="store_true", help="end each run at its threshold")
    p.add_argument("--out", type=Path, default=REPO / "results", help="results root (default: results/)")
    p.add_argument("--force", action="store_true", help="rerun jobs whose summary.json exists")
    p.add_argument("--report-only", action="store_true", help="only rebuild the report from existing runs")
    a = p.parse_args(argv)
    suite = get_suite(a.suite)
    algos = requested_algos(suite, a.algos)
    refusal = check_packages(suite, algos, a.report_only)
    if refusal is None and not a.report_only:
        refusal = prepare_runners(algos)
    if refusal:  # before any job runs and before anything is written
        print(refusal, file=sys.stderr, flush=True)
        raise SystemExit(2)
    out = a.out / (f"{suite.name}-smoke" if a.smoke else suite.name)
    out.mkdir(parents=True, exist_ok=True)
    seeds = a.seed_list or list(range(1, a.seeds + 1))
    status: dict[str, str] = {}
    if not a.report_only:
        jobs = plan(suite, out, seeds, a.envs, a.algos, a.smoke, a.stop_on_threshold)
        budget = None if a.budget_minutes is None else 60.0 * a.budget_minutes
        print(f"[bench] suite {suite.name}: {len(jobs)} jobs, {a.jobs} in parallel, out {out}", flush=True)
        status = execute(jobs, max(1, a.jobs), budget, a.force)
    runs = collect_runs(suite, out)
    if a.report_only and not runs:
        # Run dirs are not versioned: rebuilding from none would overwrite a committed report.
        raise SystemExit(f"--report-only: no finished runs under {out / 'runs'}; nothing rebuilt")
    meta = {
        "suite": suite.name,
        "seeds": sorted({s for (_, _, s) in runs}) or seeds,
        "jobs": a.jobs,
        "cpus": os.cpu_count(),
        "smoke": a.smoke,
        "budget_minutes": a.budget_minutes,
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": sys.version.split()[0],
        "status": status,
    }
    payload = write_report(suite, out, runs, meta)
    print(f"[bench] wrote {out / 'table.md'}, {out / 'results.json'} and {len(payload['plots'])} plot(s)", flush=True)
    print((out / "table.md").read_text(), flush=True)
    failed = [k for k, v in status.items() if v.startswith("failed")]
    if failed:
        print(f"[bench] failed jobs: {failed}", file=sys.stderr, flush=True)
    return payload


if __name__ == "__main__":
    payload = main()
    sys.exit(1 if any(str(v).startswith("failed") for v in payload["meta"]["status"].values()) else 0)
