"""``marl_extra``: GRPO vs MAPPO vs IPPO on the butterfly / sisl families (issue 13).

Same rules as the ``marl`` suite (the CLI, the tuned defaults of ``envs/multiagent.py``, the same
greedy evaluation, equal env-step budgets for the three algorithms); the envs need the optional
extra (``pip install -e ".[marl-extra]"``: supersuit, pymunk, Box2D, pygame). Returns are mean
per-agent episode returns on the env's own scale; there is no solve threshold, so the table
compares final greedy returns. The random / scripted references are not training runs:
``python -m benchmarks.marl_extra refs`` measures them (``results/marl_extra/README.md``).

Budgets are sized for this 2-core CPU, roughly 3-7 minutes of wall clock per run (one torch
thread, evaluations included, two jobs on the two cores), *not* for the issue's targets
(multiwalker's PPO reference took 6M steps). Whole-run steps/s measured by this suite on
2026-12-03 (medians of 3 seeds, ``--jobs 2``; the image envs after the preprocessing change of
:func:`grpo_marl.marl.preprocess.apply`, before it in parentheses, from short runs under load):

================================  =============  ============  ============  =================
env                               GRPO           MAPPO         IPPO          budget (each)
================================  =============  ============  ============  =================
knights_archers_zombies (vector)  342            250           401           60,000 steps
multiwalker                       472            374           474           90,000 steps
cooperative_pong (48x48x4 CNN)    122 (37)       69 (28)       84 (38)       20,000 steps
pistonball (48x48x3 CNN, 20 ag.)  15 (6.0)       8.4 (< 4.5)   10 (n/m)      3,000 steps
================================  =============  ============  ============  =================

The image envs' cost is the env's own rendering per agent and step plus the CNN updates
(pistonball: 20 agents x 1,000 env steps = 20,000 samples per GRPO update, about half its wall
clock); periodic evaluations are 8 greedy episodes (pistonball: 8 x 125 env steps, ~25 s).
``--smoke`` keeps the tuned batch sizes (a suite has no smoke-only overrides), so a smoke job still
collects one full update: ~20-40 s per job on KAZ (GRPO: 16 episodes, ~3k steps) and multiwalker,
under a minute on cooperative_pong, ~1-2 min on pistonball (GRPO: 8 episodes = 1,000 steps).
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
                eval_every=5_000,
                final_episodes=8,
                total_steps={"grpo": 20_000, "mappo": 20_000, "ippo": 20_000},
                smoke_steps=512,
                smoke_eval_every=512,
                metric_digits=2,
            ),
            EnvEntry(
                "pistonball",
                "butterfly pistonball_v6 (20 pistons, 125 cycles, 48x48x3 grayscale, CNN)",
                eval_every=1_500,
                final_episodes=4,
                total_steps={"grpo": 3_000, "mappo": 3_000, "ippo": 3_000},
                smoke_steps=500,
                smoke_eval_every=500,
                metric_digits=2,
            ),
        ],
        target="grpo",
        references=["mappo", "ippo"],
        eval_episodes=8,
        needs=("supersuit", "pymunk", "Box2D", "pygame"),  # grpo_marl.marl.preprocess.FAMILY_MODULES
    )
)
