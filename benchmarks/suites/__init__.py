"""Benchmark suites: named sets of (envs x algorithms), looked up by ``--suite NAME``.

A suite is data (:class:`Suite`): its envs with the eval cadence and env-step budget per
algorithm, the algorithms (names in :data:`benchmarks.runners.RUNNERS`), and which algorithm the
table compares against which references. Built-in suites live in ``benchmarks/suites/<name>.py``
and are imported on first lookup, so the multi-agent (``marl``) and text (``text``) suites plug in
by adding a module that calls :func:`register_suite` — the harness itself does not change.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EnvEntry:
    """One env of a suite.

    Attributes:
        env: registered env name (``grpo_marl.registry``), passed as ``env=`` to every runner.
        label: display name in tables and plots (e.g. the Gymnasium id).
        eval_every: greedy-evaluation cadence in env steps, the same for every algorithm.
        total_steps: env-step budget per algorithm; a missing/None entry uses the algorithm's own
            default (the env's tuned ``total_steps``, or the zoo's ``n_timesteps`` for SB3).
        threshold: solve threshold (None = the env's registered one).
        overrides: extra ``key=value`` CLI overrides per algorithm (grpo_marl runners only).
        smoke_steps / smoke_eval_every: the tiny budget of ``--smoke``.
        metric: the eval metric the threshold applies to and the table/curves report (a key of the
            runs' eval lines and ``summary.json``; ``eval/accuracy`` for text tasks).
        metric_digits: decimals of that metric in the table.
        final_episodes: episodes of each run's final greedy evaluation (``eval.final_episodes``;
            None = the suite's ``eval_episodes``, as the periodic ones); ignored by ``--smoke``.
        compare_at: extra tables that read every algorithm at the same budgets, by axis: ``step``
            (env steps, e.g. every evaluation point) or ``wall_s`` (wall seconds), each with its
            budgets (``benchmarks.report.equal_budget_markdown``).
    """

    env: str
    label: str
    eval_every: int
    total_steps: dict[str, int | None] = field(default_factory=dict)
    threshold: float | None = None
    overrides: dict[str, list[str]] = field(default_factory=dict)
    smoke_steps: int = 2048
    smoke_eval_every: int = 1024
    metric: str = "eval/return_mean"
    final_episodes: int | None = None
    metric_digits: int = 1
    compare_at: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = sorted(set(self.compare_at) - {"step", "wall_s"})
        if bad:
            raise ValueError(f"EnvEntry {self.env!r}: compare_at axes {bad} unknown; valid: step, wall_s")


@dataclass
class Suite:
    """A named benchmark: envs x algorithms, plus what the ratio columns compare.

    ``eval_unit`` and ``step_unit`` name what an evaluation averages over and what ``env steps``
    count, in the table's wording (text: 100 ``prompts``, ``completions``); ``references_label``
    names the references in the ratio heading. ``needs``: the modules its envs need beyond the
    base install (keys of ``benchmarks.runners.PACKAGE_OF``), checked by ``python -m benchmarks.run``
    before any job starts, as the runners' own needs are. ``threshold_from``: an algorithm of the
    suite whose median final metric over seeds is each env's threshold (instead of the entry's or
    the registered one); every run's steps/time to it are then read from its curve, and the final
    column shows medians over seeds.
    """

    name: str
    description: str
    envs: list[EnvEntry]
    algos: list[str]
    target: str = "grpo"  # the algorithm whose ratios the table reports
    references: list[str] = field(default_factory=lambda: ["sb3_ppo", "ppo"])
    eval_episodes: int = 20
    eval_unit: str = "episodes"
    step_unit: str = "env steps"
    references_label: str = "the PPO baselines"
    needs: tuple[str, ...] = ()
    threshold_from: str | None = None

    def env(self, name: str) -> EnvEntry:
        for e in self.envs:
            if e.env == name:
                return e
        raise KeyError(f"suite {self.name!r} has no env {name!r}; it has {[e.env for e in self.envs]}")


SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    SUITES[suite.name] = suite
    return suite


def get_suite(name: str) -> Suite:
    """The suite registered as ``name``, importing ``benchmarks.suites.<name>`` on first use."""
    if name not in SUITES:
        try:
            importlib.import_module(f"benchmarks.suites.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"benchmarks.suites.{name}":
                raise
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; known: {sorted(SUITES) or ['classic']}")
    return SUITES[name]


def to_dict(suite: Suite) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(suite)
