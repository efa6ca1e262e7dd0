"""TRL's ``GRPOTrainer`` as a benchmark peer: the ``trl_grpo`` algorithm of the ``text`` suite.

    python -m benchmarks.trl_runner env=arithmetic seed=1 total_steps=1024 eval.every_steps=512 \\
        hydra.run.dir=results/text/runs/arithmetic/trl_grpo/seed1

It takes the ``key=value`` overrides of ``python -m grpo_marl.train`` and resolves them exactly as
our CLI does (our config files, then the env's tuned defaults, then the command line), so both
sides train the same thing: the same tiny model (architecture and init seed, built by our
``TextTask``), prompts, reward (the task's own scorer, weights included), completions per prompt
(``algo.group_size``), prompts per update (``algo.num_groups``), completion length, learning rate
and schedule, loss aggregation, reward scaling, clip range, KL weight, epochs x minibatches,
temperature, top-p, grad clipping and Adam epsilon. Tokens our sampler never emits (padding,
``<unk>``) are suppressed in TRL's sampler too. It then writes the run-directory files our trainer
writes, so ``benchmarks.report`` reads both alike:

* ``metrics.jsonl``: ``step`` (completions sampled), ``train/updates``, ``time/wall_s``,
  ``time/step_s``, ``time/sps``, ``rollout/*``, and on evaluation lines the greedy evaluation of
  our ``TextTask.evaluate`` (``eval/accuracy``, ``eval/return_mean``, ...), at the same cadence in
  completions (``eval.every_steps``), timed the same way (inside the wall clock, outside step times);
* ``summary.json``: final evaluation, ``env_steps``, ``wall_seconds``, steps/time to threshold and
  the ``throughput/*`` keys of :func:`grpo_marl.tasks.text.throughput_summary`.

Settings TRL has no counterpart for (our DAPO dynamic sampling ``algo.zero_std``, hard-prompt
sampling ``text.prompt_sampling=hard``, an entropy bonus, ``target_kl``, reference refreshes) are
printed and listed in ``summary.json`` under ``unmatched``. TRL is an optional extra
(``pip install -e ".[bench]"``); :func:`build_trainer`, :func:`grpo_config` and
:class:`StepClock` are shared with ``benchmarks/text.py``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRL_MISSING = (
    "TRL is not installed: the trl_grpo benchmark runner needs the bench extra "
    '(pip install -e ".[bench]", which pins trl>=1.0)'
)

# Our config values -> GRPOConfig values (the names agree; the table documents that they mean the same).
AGGREGATION = {"grpo": "grpo", "dapo": "dapo", "dr_grpo": "dr_grpo"}  # algo.aggregation -> loss_type
SCALE = {"group": "group", "batch": "batch", "none": "none"}  # algo.scale -> scale_rewards
SCHEDULE = {"constant": "constant", "linear": "linear", "cosine": "cosine"}  # algo.lr_schedule


def require_trl() -> None:
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(f"error: {TRL_MISSING}")


# ----------------------------------------------------------------------------- shared with text.py


class TaskReward:
    """One TRL reward function: the task's own scorer (weighted total), as our trainer uses it.

    Also counts what TRL sampled (completions, completion tokens, accuracy), since it is called
    once per generation batch with the batch's completion ids.
    """

    __name__ = "task_reward"

    def __init__(self, task: Any) -> None:
        self.task = task
        self.completions = 0
        self.tokens = 0
        self.last: dict[str, float] = {}

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        answer: list[str],
        completion_ids: list[list[int]] | None = None,
        **_: Any,
    ) -> list[float]:
        # Conversational datasets get each completion as a list with one assistant message.
        texts = [c if isinstance(c, str) else "".join(m["content"] for m in c) for c in completions]
        total, _per_fn, acc = self.task.score(list(prompts), texts, list(answer))
        n_tokens = sum(len(ids) for ids in completion_ids) if completion_ids is not None else 0
        self.completions += len(completions)
        self.tokens += n_tokens
        self.last = {
            "rollout/reward_mean": float(total.mean()),
            "rollout/reward_std": float(total.std()),
            "rollout/accuracy": float(acc.mean()),
            "rollout/completion_tokens": float(n_tokens),
            "rollout/completion_len_mean": n_tokens / max(len(completions), 1),
        }
        return [float(x) for x in total]


def grpo_config(
    *,
    output_dir: str | Path,
    prompts: int,
    group_size: int,
    max_new_tokens: int,
    lr: float,
    updates: int,
    seed: int,
    aggregation: str = "dapo",
    scale: str = "group",
    beta: float = 0.0,
    epochs: int = 1,
    minibatches: int = 1,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_grad_norm: float = 1.0,
    adam_eps: float = 1e-8,
    lr_schedule: str = "constant",
    mask_truncated: bool = False,
    sequence_ratio: bool = False,
    suppress_ids: list[int] | None = None,
    cpu: bool = True,
    bf16: bool = False,
    gradient_checkpointing: bool | None = None,
) -> Any:
    """TRL's ``GRPOConfig`` for ``updates`` of our updates: ``prompts`` x ``group_size``
    completions sampled per update, ``epochs`` passes of ``minibatches`` optimizer steps over them
    (TRL: ``num_iterations`` x ``steps_per_generation``). ``gradient_checkpointing=None`` keeps
    TRL's default (on)."""
    from trl import GRPOConfig

    batch = prompts * group_size
    if batch % minibatches:
        raise ValueError(f"{batch} completions per update do not split into {minibatches} minibatches")
    extra: dict[str, Any] = {}
    if gradient_checkpointing is not None:
        extra["gradient_checkpointing"] = gradient_checkpointing
    return GRPOConfig(
        **extra,
        output_dir=str(output_dir),
        per_device_train_batch_size=batch // minibatches,
        steps_per_generation=minibatches,
        num_iterations=epochs,
        num_generations=group_size,
        max_completion_length=max_new_tokens,
        learning_rate=lr,
        lr_scheduler_type=SCHEDULE[lr_schedule],
        warmup_steps=0,
        max_steps=updates * minibatches * epochs,
        beta=beta,
        loss_type=AGGREGATION[aggregation],
        scale_rewards=SCALE[scale],
        epsilon=clip_low,
        epsilon_high=clip_high,
        importance_sampling_level="sequence" if sequence_ratio else "token",
        temperature=temperature,
        top_p=top_p,
        max_grad_norm=max_grad_norm,
        optim="adamw_torch",  # weight_decay 0: plain Adam, as ours
        adam_epsilon=adam_eps,
        weight_decay=0.0,
        mask_truncated_completions=mask_truncated,
        generation_kwargs={"suppress_tokens": list(suppress_ids)} if suppress_ids else None,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=cpu,
        bf16=bf16,
        seed=seed,
        disable_dropout=True,
    )


def build_trainer(
    model: Any, tokenizer: Any, task: Any, args: Any, callbacks: list[Any], prompts: list[Any] | None = None
) -> tuple[Any, TaskReward]:
    """A ``GRPOTrainer`` on the task's train split (repeated to cover ``args.max_steps``; TRL
    shuffles it) with :class:`TaskReward` as its only reward function. ``prompts`` replaces the
    split's prompts (e.g. chat messages with the run's system prompt), one per train row."""
    from datasets import Dataset
    from trl import GRPOTrainer

    per_generation = args.per_device_train_batch_size * args.steps_per_generation // args.num_generations
    updates = math.ceil(args.max_steps / (args.steps_per_generation * args.num_iterations))
    n_rows = (updates + 1) * per_generation
    rows = [i % len(task.train) for i in range(n_rows)]
    source = list(task.train.prompts) if prompts is None else list(prompts)
    ds = Dataset.from_dict({"prompt": [source[i] for i in rows], "answer": [task.train.answers[i] for i in rows]})
    reward = TaskReward(task)
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tokenizer, callbacks=callbacks
    )
    return trainer, reward


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class StepClock:
    """Times our "updates" inside TRL: one update = ``opt_steps`` optimizer steps (TRL's
    ``steps_per_generation x num_iterations`` over one generation batch), from the first step's
    begin (generation included) to the last step's end. After each update, ``on_update(update,
    seconds, model, control)`` runs outside the clock (evaluations go there). Built with
    :meth:`make`, since its base class comes from transformers."""

    @classmethod
    def make(cls, opt_steps: int, on_update: Callable[..., None]) -> Any:
        base = _callback_base()

        class _Clock(cls, base):  # type: ignore[misc, valid-type]
            pass

        return _Clock(opt_steps, on_update)

    def __init__(self, opt_steps: int, on_update: Callable[..., None]) -> None:
        self.opt_steps = max(1, int(opt_steps))
        self.on_update = on_update
        self.step_times: list[float] = []
        self.cpu_times: list[float] = []
        self._t0: float | None = None
        self._c0 = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._t0 is None:
            self._t0, self._c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step % self.opt_steps and state.global_step < state.max_steps:
            return
        assert self._t0 is not None
        dt = time.perf_counter() - self._t0
        self.step_times.append(dt)
        self.cpu_times.append(time.process_time() - self._c0)
        self._t0 = None
        self.on_update(len(self.step_times), dt, kw.get("model"), control)


# ----------------------------------------------------------------------------- the suite runner


def _split_argv(argv: list[str]) -> tuple[list[str], Path, dict[str, Any]]:
    """Hydra-style ``key=value`` overrides -> (config overrides, run dir, runner options); other
    hydra.* keys dropped. Runner option: ``--gradient-checkpointing=true|false`` (default: TRL's)."""
    overrides, run_dir = [], None
    options: dict[str, Any] = {"gradient_checkpointing": None}
    for arg in argv:
        if arg.startswith("--gradient-checkpointing="):
            value = arg.split("=", 1)[1].lower()
            if value not in ("true", "false"):
                raise SystemExit(f"error: --gradient-checkpointing takes true or false, got {value!r}")
            options["gradient_checkpointing"] = value == "true"
        elif arg.startswith("hydra.run.dir="):
            run_dir = Path(arg.split("=", 1)[1])
        elif arg.startswith("hydra."):
            continue
        elif "=" not in arg:
            raise SystemExit(f"error: expected key=value overrides (as for python -m grpo_marl.train), got {arg!r}")
        else:
            overrides.append(arg)
    if run_dir is None:
        raise SystemExit("error: pass the run directory as hydra.run.dir=PATH")
    return overrides, run_dir, options


def resolve(overrides: list[str]) -> Any:
    """Our resolved config for these overrides (what ``python -m grpo_marl.train`` would train)."""
    from hydra import compose, initialize_config_dir

    from grpo_marl import config as config_mod

    with initialize_config_dir(config_dir=str(REPO / "grpo_marl" / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return config_mod.resolve_config(cfg, overrides)


def unmatched_settings(cfg: Any) -> list[str]:
    """Our settings TRL's GRPOTrainer has no counterpart for (its behaviour is used instead)."""
    a, t = cfg.algo, cfg.text
    out = []
    if str(a.zero_std) != "keep":
        out.append(f"algo.zero_std={a.zero_std}: no dynamic sampling in TRL (zero-variance groups stay in the batch)")
    if str(t.get("prompt_sampling", "uniform")) != "uniform":
        out.append(f"text.prompt_sampling={t.prompt_sampling}: TRL draws prompts uniformly (shuffled epochs)")
    if str(a.get("minibatch_split", "rows")) != "rows":
        out.append(
            f"algo.minibatch_split={a.minibatch_split}: TRL shuffles the rows of a generation batch across its "
            "optimizer steps"
        )
    if float(a.get("entropy_coef", 0.0) or 0.0):
        out.append(f"algo.entropy_coef={a.entropy_coef}: no entropy bonus in TRL")
    if a.get("target_kl") is not None:
        out.append(f"algo.target_kl={a.target_kl}: no KL early stop in TRL")
    if int(a.get("ref_refresh", 0) or 0) and float(a.beta):
        out.append(f"algo.ref_refresh={a.ref_refresh}: the TRL reference stays frozen")
    return out


def chat_prompts(task: Any) -> list[Any]:
    """The train prompts as TRL should see them: chat messages (the run's system prompt added)
    when our run renders them through the chat template, else the plain prompt strings."""
    if not task.chat_template:
        return list(task.train_text)
    system = task.cfg.text.get("system_prompt") or None
    out = []
    for p in task.train_set.prompts:
        messages = [{"role": "user", "content": p}] if isinstance(p, str) else [dict(m) for m in p]
        if system and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system})
        out.append(messages)
    return out


def run(cfg: Any, run_dir: Path, gradient_checkpointing: bool | None = None) -> dict[str, Any]:
    import torch
    import trl
    from omegaconf import OmegaConf

    from grpo_marl.policies.llm import LLMPolicy
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.text import TextTask, throughput_summary
    from grpo_marl.trainer import autocast_dtype, resolve_device, seed_everything

    spec = get_spec(str(cfg.env))
    if spec.kind != "text":
        raise SystemExit(f"error: trl_grpo trains text envs only; env {spec.name!r} is of kind {spec.kind!r}")
    if str(cfg.algo.name) != "grpo":
        raise SystemExit(f"error: trl_grpo mirrors algo=grpo, not algo={cfg.algo.name}")
    threads = int(cfg.get("threads", 0) or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    seed_everything(int(cfg.seed))
    device = resolve_device(str(cfg.device))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    unmatched = unmatched_settings(cfg)
    for line in unmatched:
        print(f"[trl_grpo] not matched: {line}", flush=True)

    task = TextTask(cfg, spec, device)  # same model init (and SFT warm start, if any) as our trainer
    policy = task.policy
    tok = policy.tokenizer
    a = cfg.algo
    per_update = int(a.num_groups) * int(a.group_size)
    total = int(cfg.total_steps)
    updates = max(1, math.ceil(total / per_update))
    vocab = int(policy.model.get_output_embeddings().weight.shape[0])
    suppress = [
        i
        for i in (tok.pad_token_id, getattr(tok, "unk_token_id", None))
        if i is not None and i != tok.eos_token_id and i < vocab
    ]
    args = grpo_config(
        output_dir=run_dir / "trl_output",
        prompts=int(a.num_groups),
        group_size=int(a.group_size),
        max_new_tokens=task.max_new_tokens,
        lr=float(a.lr),
        updates=updates,
        seed=int(cfg.seed),
        aggregation=str(a.aggregation),
        scale=str(a.scale),
        beta=float(a.beta),
        epochs=int(a.epochs),
        minibatches=int(a.minibatches),
        clip_low=float(a.clip_eps_low),
        clip_high=float(a.clip_eps_high),
        temperature=task.temperature,
        top_p=task.top_p,
        max_grad_norm=float(a.get("max_grad_norm", 0.0) or 0.0),
        adam_eps=float(a.get("adam_eps", 1e-8)),
        lr_schedule=str(a.lr_schedule),
        mask_truncated=task.mask_truncated,
        sequence_ratio=str(a.get("loss", "grpo")) == "gspo",
        suppress_ids=suppress,
        cpu=device.type == "cpu",
        bf16=autocast_dtype(str(cfg.get("autocast", "auto")), device, "text") is not None,
        gradient_checkpointing=gradient_checkpointing,
    )

    metrics_f = open(run_dir / "metrics.jsonl", "w")
    every_eval = int(cfg.eval.every_steps)
    log_every = max(1, int(cfg.log.every))
    threshold = None if cfg.train.threshold is None else float(cfg.train.threshold)
    st: dict[str, Any] = {
        "start": None,
        "next_eval": every_eval if every_eval > 0 else None,
        "steps_to_threshold": None,
        "time_to_threshold": None,
    }
    eval_policy: dict[int, Any] = {}

    def evaluate(model: Any) -> dict[str, float]:
        pol = policy
        if model is not None and model is not policy.model:  # TRL wrapped it: same weights, our decoder
            if id(model) not in eval_policy:
                eval_policy[id(model)] = LLMPolicy(model, tok)
            pol = eval_policy[id(model)]
        pol.eval()
        try:
            with torch.no_grad():
                return task.evaluate(pol, int(cfg.eval.episodes))
        finally:
            pol.train()

    def on_update(update: int, seconds: float, model: Any, control: Any) -> None:
        steps = reward.completions
        rec: dict[str, Any] = {
            "step": steps,
            "train/updates": float(update),
            **reward.last,
            "time/step_s": seconds,
            "time/sps": per_update / max(seconds, 1e-9),
        }
        if st["next_eval"] is not None and steps >= st["next_eval"]:
            while st["next_eval"] <= steps:
                st["next_eval"] += every_eval
            ev = evaluate(model)
            rec.update(ev)
            if threshold is not None and st["steps_to_threshold"] is None and ev[task.threshold_metric] >= threshold:
                st["steps_to_threshold"] = steps
                st["time_to_threshold"] = time.perf_counter() - st["start"]
                rec["eval/threshold_reached"] = 1.0
                if bool(cfg.train.stop_on_threshold):
                    control.should_training_stop = True
        rec["time/wall_s"] = time.perf_counter() - st["start"]
        if update % log_every == 0 or "eval/accuracy" in rec:
            st["pending"] = rec  # written by on_log, which follows with TRL's loss for this step

    def flush() -> None:
        if st.get("pending") is not None:
            metrics_f.write(json.dumps(st.pop("pending")) + "\n")
            metrics_f.flush()

    clock = StepClock.make(int(a.minibatches) * int(a.epochs), on_update)

    class _Hooks(_callback_base()):  # type: ignore[misc]
        def on_train_begin(self, *args: Any, **kw: Any) -> None:
            st["start"] = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            rec = st.get("pending")
            if rec is not None and logs:
                for ours, theirs in (
                    ("train/loss", "loss"),
                    ("train/lr", "learning_rate"),
                    ("train/grad_norm", "grad_norm"),
                    ("train/clip_ratio", "clip_ratio/region_mean"),
                ):
                    if theirs in logs:
                        rec[ours] = float(logs[theirs])
            flush()

    trainer, reward = build_trainer(policy.model, tok, task.text_task, args, [_Hooks(), clock], chat_prompts(task))
    if every_eval > 0:  # the untrained model, outside the wall clock (on_train_begin starts it)
        metrics_f.write(json.dumps({"step": 0, **evaluate(None), "time/wall_s": 0.0}) + "\n")
        metrics_f.flush()
    status = "completed"
    try:
        trainer.train()
    except Exception as exc:
        metrics_f.close()
        task.close()
        _write_summary(run_dir, {"status": "failed", "error": str(exc), "env_steps": reward.completions})
        raise
    wall = time.perf_counter() - st["start"]
    flush()
    if st["steps_to_threshold"] is not None and bool(cfg.train.stop_on_threshold):
        status = "threshold_reached"
    final = evaluate(trainer.model)
    metrics_f.write(json.dumps({"step": reward.completions, **final}) + "\n")
    metrics_f.close()
    task.close()
    summary = {
        "env": str(cfg.env),
        "algo": "trl_grpo",
        "seed": int(cfg.seed),
        "status": status,
        **final,
        "env_steps": reward.completions,
        "updates": len(clock.step_times),
        "wall_seconds": wall,
        "threshold": threshold,
        "steps_to_threshold": st["steps_to_threshold"],
        "time_to_threshold_s": st["time_to_threshold"],
        "text/task": task.text_task.name,
        "text/max_new_tokens": task.max_new_tokens,
        **throughput_summary(clock.step_times, reward.completions, reward.tokens, device, clock.cpu_times),
        "trl_version": trl.__version__,
        "trl_gradient_checkpointing": bool(args.gradient_checkpointing),
        "unmatched": unmatched,
    }
    _write_summary(run_dir, summary)
    return summary


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=float) + "\n")
    tmp.replace(run_dir / "summary.json")


def main(argv: list[str] | None = None) -> int:
    overrides, run_dir, options = _split_argv(list(sys.argv[1:] if argv is None else argv))
    require_trl()
    from grpo_marl.config import ConfigError

    try:
        cfg = resolve(overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        s = run(cfg, run_dir, **options)
    except SystemExit:
        raise
    except Exception as exc:
        traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    acc = s.get("eval/accuracy")
    print(
        f"env={s['env']} algo=trl_grpo seed={s['seed']} | accuracy {acc:.3f} | completions {s['env_steps']}, "
        f"wall {s['wall_seconds']:.1f} s | run dir {run_dir}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
