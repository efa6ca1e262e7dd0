"""``marl_extra``: GRPO vs MAPPO vs IPPO on the butterfly / sisl families (issue 13).

Same rules as the ``marl`` suite (the CLI, the tuned defaults of ``envs/multiagent.py``, the same
greedy evaluation, equal env-step budgets for the three algorithms); the envs need the optional
extra (``pip install -e ".[marl-extra]"``: supersuit, pymunk, Box2D, pygame). Returns are mean
per-agent episode returns on the env's own scale; there is no solve threshold, so the table
compares final greedy returns. The random / scripted references are not training runs:
``python -m benchmarks.marl_extra refs`` measures them (``results/marl_extra/README.md``).

Budgets are sized for this 2-core CPU, roughly 5-10 minutes of wall clock per run (one torch
thread, evaluations included), *not* for the issue's targets (multiwalker's PPO reference took 6M
steps). Training steps/s measured 2026-12-03 with short runs of the tuned configs (``nice -n 19``,
load average 3-5 from other benchmarks on the 2 cores; a free machine is faster):

================================  ======  ======  ======  =================
env                               GRPO    MAPPO   IPPO    budget (each)
================================  ======  ======  ======  =================
knights_archers_zombies (vector)  184     163     169     60,000 steps
multiwalker                       230     238     231     90,000 steps
cooperative_pong (48x48x4 CNN)    37      28      38      12,000 steps
pistonball (48x48x3 CNN, 20 ag.)  6.0     < 4.5   n/m     2,000 steps
================================  ======  ======  ======  =================

(cooperative_pong / pistonball GRPO measured with fewer envs per update than tuned; their cost is
the env's rendering per step, so steps/s barely depends on it. Pistonball MAPPO did not finish its
first 500-step update in ~100 s (load average 6 by then); IPPO was not measured (n/m), assumed as
MAPPO. Pistonball evaluations are costly too: 8 greedy episodes = 1,000 env steps, ~1.5 min.) Multiwalker's rate is early-training
(short episodes); under the heavier load of ``results/marl_extra/README.md`` it was 30-40 steps/s.
``--smoke`` keeps the tuned batch sizes (a suite has no smoke-only overrides), so a smoke job still
collects one full update: ~20-40 s per job on KAZ (GRPO: 16 episodes, ~3k steps) and multiwalker,
~1 min on cooperative_pong, but ~2-3 min on pistonball (GRPO: 8 episodes = 1,000 steps at 6/s).
"""

import benchmarks.suites.marl  # noqa: F401  (registers the mappo / ippo runners)
from benchmarks.suites import EnvEntry, Suite, register_suite

register_suite(
    Suite(
        name="marl_extra",
        description="PettingZoo butterfly/sisl: GRPO (seed groups) vs MAPPO vs IPPO",
        algos=["grpo", "mappo", "ippo"],
        envs=[
            EnvEntry(
                "knights_archers_zombies",
                "butterfly knights_archers_zombies_v11 (vector obs, 900 cycles, 10 zombies)",
                eval_every=15_000,
                final_episodes=16,
                total_steps={"grpo": 60_000, "mappo": 60_000, "ippo": 60_000},
                smoke_steps=1024,
                smoke_eval_every=1024,
                metric_digits=2,
            ),
            EnvEntry(
                "multiwalker",
                "sisl multiwalker_v9 (3 walkers, continuous)",
                eval_every=15_000,
                final_episodes=16,
                total_steps={"grpo": 90_000, "mappo": 90_000, "ippo": 90_000},
                smoke_steps=2048,
                smoke_eval_every=2048,
            ),
            EnvEntry(
                "cooperative_pong",
                "butterfly cooperative_pong_v6 (48x48x4 grayscale, CNN)",
                eval_every=4_000,
                final_episodes=8,
                total_steps={"grpo": 12_000, "mappo": 12_000, "ippo": 12_000},
                smoke_steps=512,
                smoke_eval_every=512,
                metric_digits=2,
            ),
            EnvEntry(
                "pistonball",
                "butterfly pistonball_v6 (20 pistons, 125 cycles, 48x48x3 grayscale, CNN)",
                eval_every=1_000,
                final_episodes=4,
                total_steps={"grpo": 2_000, "mappo": 2_000, "ippo": 2_000},
                smoke_steps=500,
                smoke_eval_every=500,
                metric_digits=2,
            ),
        ],
        target="grpo",
        references=["mappo", "ippo"],
        eval_episodes=8,
    )
)
