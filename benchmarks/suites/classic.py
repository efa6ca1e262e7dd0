"""``classic``: Gymnasium classic control, GRPO vs our PPO vs SB3 PPO (rl-zoo hyperparameters).

Budgets: PPO (ours and SB3) gets rl-zoo's ``n_timesteps`` (its linear schedules decay over it),
except Acrobot, capped from the zoo's 1e6 to 2e5 (PPO solves it well before; the zoo's Acrobot
schedule is constant, so the cap only truncates). GRPO gets its env defaults (``total_steps`` of
``envs/conf/<env>.yaml``). Eval cadences are in env steps and shared by all three.
"""

from benchmarks.suites import EnvEntry, Suite, register_suite

register_suite(
    Suite(
        name="classic",
        description="Gymnasium classic control: GRPO vs our PPO vs Stable-Baselines3 PPO",
        algos=["grpo", "ppo", "sb3_ppo"],
        envs=[
            EnvEntry("cartpole", "CartPole-v1", eval_every=2500, total_steps={"ppo": 100_000, "sb3_ppo": 100_000}),
            EnvEntry("pendulum", "Pendulum-v1", eval_every=4096, total_steps={"ppo": 100_000, "sb3_ppo": 100_000}),
            EnvEntry("acrobot", "Acrobot-v1", eval_every=8192, total_steps={"ppo": 200_000, "sb3_ppo": 200_000}),
            EnvEntry(
                "mountaincar_continuous",
                "MountainCarContinuous-v0",
                eval_every=2000,
                total_steps={"ppo": 20_000, "sb3_ppo": 20_000},
            ),
        ],
    )
)
