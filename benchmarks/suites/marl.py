"""``marl``: multi-agent GRPO vs MAPPO vs IPPO on the shipped PettingZoo tasks.

All three go through the CLI with the same actor (per-group MLP), the same multi-process episode
collector and the same greedy evaluation; MAPPO/IPPO add a centralized / per-agent critic
(one PPO, ``grpo_marl/algos/ppo.py``). Returns are mean per-agent episode returns on the env's own reward
scale (mpe2 defaults). The random-policy and scripted greedy-assignment references are not
training runs: ``python benchmarks/marl.py --references-only`` measures them.

Budgets (env = joint steps): simple_spread 2.5M (GRPO's default; it passes the greedy-assignment
score there), simple_speaker_listener 500k, pursuit (8x8, 4 pursuers, 50 steps; slow env) 100k.
"""

from benchmarks.runners import Job, grpo_marl_command, register_runner
from benchmarks.suites import EnvEntry, Suite, register_suite


@register_runner("mappo")
def _mappo(job: Job) -> list[str]:
    return grpo_marl_command(job, "mappo")


@register_runner("ippo")
def _ippo(job: Job) -> list[str]:
    return grpo_marl_command(job, "ippo")


register_suite(
    Suite(
        name="marl",
        description="PettingZoo multi-agent: GRPO (seed groups) vs MAPPO vs IPPO",
        algos=["grpo", "mappo", "ippo"],
        envs=[
            # 50-episode evaluations have a standard error of ~0.5 here: the final one uses 1000.
            EnvEntry(
                "simple_spread",
                "mpe2 simple_spread_v3 (N=3, 25 steps)",
                eval_every=250_000,
                final_episodes=1000,
                total_steps={"grpo": 2_500_000, "mappo": 2_500_000, "ippo": 2_500_000},
                smoke_steps=3200,
                smoke_eval_every=3200,
            ),
            EnvEntry(
                "simple_speaker_listener",
                "mpe2 simple_speaker_listener_v4",
                eval_every=50_000,
                final_episodes=1000,
                total_steps={"grpo": 500_000, "mappo": 500_000, "ippo": 500_000},
                smoke_steps=3200,
                smoke_eval_every=3200,
            ),
            EnvEntry(
                "pursuit",
                "sisl pursuit_v5 (8x8, 4 pursuers, 50 steps)",
                eval_every=10_000,
                final_episodes=200,
                total_steps={"grpo": 100_000, "mappo": 100_000, "ippo": 100_000},
                smoke_steps=800,
                smoke_eval_every=800,
            ),
        ],
        target="grpo",
        references=["mappo", "ippo"],
        eval_episodes=50,
    )
)
