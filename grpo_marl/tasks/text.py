"""Task glue for text envs: a causal-LM policy sampling G completions per prompt.

One update: draw ``algo.num_groups`` prompts from the train split (shuffled epochs, seeded),
sample ``algo.group_size`` completions each with the KV-cache sampler, score them with the task's
reward functions in one batched call, and hand the GRPO algorithm a ``[B, T]`` batch whose time
axis is the completion tokens. The outcome reward sits on each completion's last valid token, so
``algo.advantage=outcome`` broadcasts the group-relative advantage to every token.

Widths are fixed per run (prompt block = the longest prompt, completion block =
``max_new_tokens``) so batches from dynamic sampling concatenate; :meth:`TextTask.log_prob`
trims all-padding columns of each minibatch before the forward pass, so the fixed layout costs
nothing in compute.

Prompts may be strings or chat messages; they are rendered through the tokenizer's chat template
per ``text.chat_template`` / ``text.system_prompt`` (:mod:`grpo_marl.text.chat`) and tokenized once.

Env steps are completions (one-step episodes), so ``total_steps`` counts sampled completions and
``time/sps`` is completions per second.

State groups (``algo.group_mode=state``): after the prompt groups are sampled, every completion
branches at ``text.branch_points`` prefixes and ``text.branch_size`` continuations are sampled from
each (prefix KV cache reused); their mean reward is the prefix's Monte-Carlo value, which the
algorithm turns into segment advantages (:func:`grpo_marl.advantages.branched_advantages`). The
continuations count as sampled completions everywhere (env steps, ``rollout/sampled_tokens``,
``rollout/branch_tokens``, throughput). With ``text.branch_train=true`` they are also trained on,
as members of their prompt's group (:meth:`TextTask._with_continuations`).
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from grpo_marl.batch import Batch
from grpo_marl.errors import ConfigError, UserInputError
from grpo_marl.logging import RunLogger
from grpo_marl.policies.base import SequenceScorer, TextPolicy
from grpo_marl.policies.llm import AdapterDisabledReference, Generation, LLMPolicy, LoraSpec, resolve_dtype
from grpo_marl.registry import EnvSpec
from grpo_marl.tasks.base import Task
from grpo_marl.text.branching import branch_points, budget_error, join_continuations
from grpo_marl.text.chat import render_prompts
from grpo_marl.text.loading import quiet_third_party
from grpo_marl.text.warm_start import sft_warm_start, trim_left


def throughput_summary(
    step_times: list[float],
    completions: int,
    tokens: float,
    device: torch.device,
    cpu_times: list[float] | None = None,
) -> dict[str, float | None]:
    """Throughput of one training process, in the keys both our trainer and the TRL benchmark
    runner (``benchmarks/trl_runner.py``) write to ``summary.json``.

    ``step_times`` are seconds per update (sampling + scoring + optimizer step, evaluations
    excluded); ``completions``/``tokens`` were sampled during them; ``cpu_times`` are the
    process CPU seconds of the same updates (all threads): unlike wall time, completions per CPU
    second do not depend on what else a shared machine runs. Peak memory: the process's resident
    set (``ru_maxrss``) and, on CUDA, the peak of allocated device memory.
    """
    train_s = float(sum(step_times))
    gpu = None
    if device.type == "cuda" and torch.cuda.is_available():
        gpu = torch.cuda.max_memory_allocated(device) / 2**20
    cpu = float(sum(cpu_times)) if cpu_times else None
    return {
        "throughput/cpu_seconds": cpu,
        "throughput/completions_per_cpu_s": completions / cpu if cpu else None,
        "throughput/updates": float(len(step_times)),
        "throughput/train_seconds": train_s,
        "throughput/step_time_s": statistics.median(step_times) if step_times else None,
        "throughput/completions_per_s": completions / train_s if train_s > 0 else None,
        "throughput/tokens_per_s": tokens / train_s if train_s > 0 else None,
        "throughput/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,  # KiB on Linux
        "throughput/peak_gpu_mb": gpu,
    }


def build_policy(cfg: DictConfig, alphabet: str, device: torch.device) -> LLMPolicy:
    """Load ``model.path`` or build a tiny model + char tokenizer over the task's alphabet (either
    way with third-party progress bars and warnings hidden: :func:`grpo_marl.text.loading.quiet_third_party`)."""
    m = cfg.model
    lora = None
    if bool(m.lora.enabled):
        target = m.lora.target_modules
        lora = LoraSpec(
            r=int(m.lora.r),
            alpha=int(m.lora.alpha),
            dropout=float(m.lora.dropout),
            target_modules=target if isinstance(target, str) else list(target),
        )
    if m.path:
        return LLMPolicy.from_pretrained(
            str(m.path),
            device=device,
            dtype=str(m.dtype),
            lora=lora,
            gradient_checkpointing=bool(m.gradient_checkpointing),
            trust_remote_code=bool(m.trust_remote_code),
        )
    from grpo_marl.tiny_lm import TinyLMConfig, build_tiny_lm

    tiny = TinyLMConfig(
        arch=str(m.arch),
        hidden_size=int(m.hidden_size),
        num_layers=int(m.num_layers),
        num_heads=int(m.num_heads),
        intermediate_size=int(m.intermediate_size),
        max_positions=int(m.max_positions),
        alphabet=alphabet,
        tie_embeddings=bool(m.tie_embeddings),
    )
    from grpo_marl.text.loading import quiet_third_party

    with quiet_third_party():  # transformers' and peft's warnings stay off the terminal, as for a load
        model, tok = build_tiny_lm(tiny, seed=int(cfg.seed))
        model = model.to(device=device, dtype=resolve_dtype(str(m.dtype), device))
        return LLMPolicy(model, tok, lora=lora, gradient_checkpointing=bool(m.gradient_checkpointing))


class TextTask(Task[LLMPolicy, AdapterDisabledReference]):
    """Everything text-specific the trainer needs (see :class:`grpo_marl.tasks.base.Task`)."""

    minibatch_by = "sequence"
    input_keys = ("input_ids", "attention_mask", "completion_mask")
    threshold_metric = "eval/accuracy"

    def __init__(self, cfg: DictConfig, spec: EnvSpec, device: torch.device, collector: str = "episodes") -> None:
        if collector != "episodes":
            raise ConfigError(
                f"text envs are trained with GRPO's episode collector; algo {cfg.algo.name!r} asks "
                f"for {collector!r}, which text does not support"
            )
        self.cfg = cfg
        self.spec = spec
        self.device = device
        self.env = spec.make(**dict(cfg.env_kwargs or {}))
        if not hasattr(self.env, "task"):
            raise UserInputError(
                f"env {spec.name!r} is registered as kind 'text' but its factory returned a "
                f"{type(self.env).__name__}, not a TextEnv (envs.text.env.TextEnv)"
            )
        self.text_task = self.env.task
        self.train_set = self.text_task.train
        self.eval_set = self.text_task.eval
        t = cfg.text
        self.temperature = float(t.temperature)
        self.top_p = float(t.top_p)
        self.mask_truncated = bool(t.mask_truncated)
        # Read once: OmegaConf attribute access costs microseconds each, per update.
        self.log_every = int(t.log_completions_every)
        self.log_n = int(t.log_completions)
        self.num_groups = int(cfg.algo.num_groups)
        self.group_size = int(cfg.algo.group_size)
        # State groups (a group mode whose members start from a snapshot): a text env's state is a
        # prefix of a sampled completion, so every completion branches (_branch).
        from grpo_marl.groups import group_mode

        self.branching = group_mode(str(cfg.algo.group_mode)).snapshots
        self.branch_rule = str(t.branch_rule)
        self.branch_points = int(t.branch_points)
        self.branch_size = int(t.branch_size)
        self.branch_train = self.branching and bool(t.branch_train)
        self.policy = build_policy(cfg, self.text_task.alphabet, device)
        # Render (chat template) and tokenize every prompt once; batches slice these tensors.
        tok = self.policy.tokenizer
        mode, system = t.chat_template, t.system_prompt or None
        self.train_text, templated = render_prompts(tok, list(self.train_set.prompts), mode, system)
        self.eval_text, _ = render_prompts(tok, list(self.eval_set.prompts), mode, system)
        self.chat_template = templated
        special = not templated  # a rendered template already holds its special tokens
        with quiet_third_party():  # a too long prompt is ours to report (_check_prompt_lengths)
            self._train_ids, self._train_mask = self.policy.encode_prompts(self.train_text, add_special_tokens=special)
            self._eval_ids, self._eval_mask = self.policy.encode_prompts(self.eval_text, add_special_tokens=special)
        self.prompt_width = int(self._train_ids.shape[1])
        self.max_new_tokens = int(t.max_new_tokens or self._default_budget(bool(cfg.model.path)))
        self._check_prompt_lengths()
        # text.branch_every=null: the budget split evenly between the branch points
        self.branch_every = int(t.branch_every or max(1, self.max_new_tokens // (self.branch_points + 1)))
        if self.branching and self.branch_rule == "every":
            problem = budget_error(self.branch_every, self.max_new_tokens, str(cfg.algo.group_mode))
            if problem:  # with text.max_new_tokens=null the task's budget is known only now
                raise UserInputError(problem + ("" if t.max_new_tokens else ", the task's budget here"))
        self.sft_stats: dict[str, float] = {}
        # On resume the checkpoint's weights replace the policy's, so the warm start is skipped.
        if int(t.sft_steps) > 0 and not cfg.resume:
            self.sft_stats = sft_warm_start(
                self.policy,
                self._train_ids,
                self._train_mask,
                self.train_set.answers,
                steps=int(t.sft_steps),
                lr=float(t.sft_lr),
                batch=int(t.sft_batch),
                weight_decay=float(t.sft_weight_decay),
                seed=int(cfg.seed),
            )
        self.generator = torch.Generator(device=device).manual_seed(int(cfg.seed))
        self.rng = np.random.default_rng(int(cfg.seed))
        self._order = np.empty(0, dtype=np.int64)
        self._pos = 0
        self.prompt_sampling = str(t.prompt_sampling)  # a choice of grpo_marl.settings.TextSettings
        self.hard_floor = float(t.hard_floor)
        # Running per-prompt accuracy of the sampled completions (prompt_sampling=hard).
        self._prompt_acc = np.zeros(len(self.train_set), dtype=np.float64)
        self.completions = 0
        self.sampled_tokens = 0.0  # every token sampled for training, branches included (curves vs tokens)
        self.updates = 0
        self.run_dir: Path | None = None
        self.logger: RunLogger | None = None
        self._finished: dict[str, Any] | None = None
        # Throughput of this process (summary.json): seconds per update from its first collect
        # to the end of its optimizer step, and what those updates sampled.
        self._t_update: float | None = None
        self._c_update = 0.0
        self._step_times: list[float] = []
        self._cpu_times: list[float] = []
        self._timed_completions = 0
        self._timed_tokens = 0.0

    def _context(self) -> int | None:
        """The model's context length in tokens (None when its config does not say)."""
        cfg = self.policy.causal_lm.config
        context = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        return int(context) if context else None

    def _check_prompt_lengths(self) -> None:
        """Refuse a prompt that leaves no room for its completion, naming its row.

        Why here: the prompts are tokenized once, just above, under the run's own tokenizer and
        chat template, so the lengths are the ones generation will see. Without the check a too
        long prompt reaches the position embedding and fails as ``IndexError: index out of range
        in self`` at the first update, naming nothing."""
        context = self._context()
        if context is None:
            return
        limit = context - self.max_new_tokens
        for split, mask, prompts in (
            ("train", self._train_mask, self.train_set),
            ("held-out", self._eval_mask, self.eval_set),
        ):
            lengths = mask.sum(1)
            worst = int(lengths.argmax())
            if int(lengths[worst]) > limit:
                over = int((lengths > limit).sum())
                more = f" ({over} {split} prompts are too long)" if over > 1 else ""
                fix = (
                    "a shorter prompt, a model with a longer context"
                    if self.cfg.model.path
                    else "a shorter prompt, a larger model.max_positions"
                )
                raise UserInputError(
                    f"{prompts.source(worst)}: the {split} prompt is {int(lengths[worst])} tokens, but the model's "
                    f"context of {context} tokens minus text.max_new_tokens={self.max_new_tokens} leaves "
                    f"{limit}{more}; use {fix}, or a smaller text.max_new_tokens"
                )

    def _default_budget(self, pretrained: bool) -> int:
        """The task's completion budget for this tokenizer (``text.max_new_tokens=null``), within
        the model's context after the longest prompt (:meth:`envs.text.tasks.TextTask.completion_budget`)."""
        context = self._context()
        longest_prompt = max(self.prompt_width, int(self._eval_ids.shape[1]))
        room = context - longest_prompt if context else None
        return self.text_task.completion_budget(self.policy.tokenizer, pretrained=pretrained, room=room)

    # -- trainer hooks -----------------------------------------------------------------------
    @property
    def env_steps(self) -> int:
        return self.completions

    def set_env_steps(self, steps: int) -> None:
        self.completions = int(steps)

    def reference_policy(self) -> LLMPolicy | AdapterDisabledReference:
        """Frozen copy of the policy, or with LoRA the adapter-disabled base (no second model)."""
        return self.policy.reference()

    def attach_run(self, run_dir: Path, logger: RunLogger | None, is_main: bool) -> None:
        """Sample completions go to ``completions.jsonl`` (appended) and the run's TensorBoard
        text (through ``logger``); only the main process writes."""
        self.run_dir = Path(run_dir) if is_main else None
        self.logger = logger if is_main else None

    # -- sampling ------------------------------------------------------------------------------
    def _next_prompts(self, n: int) -> np.ndarray:
        """``n`` train-prompt indices, walking seeded shuffles of the split (every prompt once per
        epoch), so small datasets are covered evenly; with ``text.prompt_sampling=hard``, drawn
        without replacement with weights ``1 - acc + hard_floor`` (running per-prompt accuracy of
        the sampled completions), so updates go to prompts the policy still gets wrong."""
        if self.prompt_sampling == "hard" and n < len(self.train_set):
            w = 1.0 - self._prompt_acc + self.hard_floor
            return self.rng.choice(len(w), size=n, replace=False, p=w / w.sum()).astype(np.int64)
        out: list[int] = []
        while len(out) < n:
            if self._pos >= len(self._order):
                self._order = self.rng.permutation(len(self.train_set))
                self._pos = 0
            take = min(n - len(out), len(self._order) - self._pos)
            out.extend(self._order[self._pos : self._pos + take].tolist())
            self._pos += take
        return np.asarray(out, dtype=np.int64)

    _trim_left = staticmethod(trim_left)

    def collect(self, policy: TextPolicy) -> Batch:
        t0 = time.perf_counter()
        if self._t_update is None:  # first collection of this update (dynamic sampling adds more)
            self._t_update, self._c_update = t0, time.process_time()
        idx = self._next_prompts(self.num_groups)
        sel = torch.as_tensor(idx, device=self.device)
        ids, mask = self._trim_left(self._train_ids[sel], self._train_mask[sel])
        gen = policy.generate(
            ids,
            mask,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            num_samples=self.group_size,
            generator=self.generator,
            keep_cache=self.branching,
            with_entropy=self.branching and self.branch_rule == "entropy",
        )
        t_gen = time.perf_counter()
        texts = policy.decode(gen.completion_ids, gen.completion_mask)
        rows = np.repeat(idx, self.group_size)
        prompts = [self.train_set.prompts[i] for i in rows]
        answers = [self.train_set.answers[i] for i in rows]
        total, per_fn, acc = self.text_task.score(prompts, texts, answers)
        t_score = time.perf_counter()
        branches = self._branch(policy, gen, prompts, answers) if self.branching else None
        gen.cache = None  # the KV cache is not needed past branching
        t_branch = time.perf_counter()
        prompts = [self.train_text[i] for i in rows]  # logged as the model saw them
        if self.prompt_sampling == "hard":
            group_acc = acc.reshape(len(idx), self.group_size).mean(1)
            self._prompt_acc[idx] = 0.5 * self._prompt_acc[idx] + 0.5 * group_acc

        b, t_len = gen.completion_mask.shape
        cm = gen.completion_mask
        valid = cm.bool()
        if self.mask_truncated:
            valid = valid & ~gen.truncated[:, None]
        rewards = torch.zeros((b, self.max_new_tokens), dtype=torch.float32, device=self.device)
        last = (cm.sum(1) - 1).clamp_min(0)
        rewards[torch.arange(b, device=self.device), last] = torch.as_tensor(
            total, dtype=torch.float32, device=self.device
        )
        pad_p = self.prompt_width - gen.prompt_len
        pad_t = self.max_new_tokens - t_len
        pad_id = policy.pad_id

        def widen(x: Tensor, value: float) -> Tensor:
            """[B, P+T] -> [B, P_max + T_max]: left-pad the prompt block, right-pad the completion."""
            return torch.nn.functional.pad(x, (pad_p, pad_t), value=value)

        def widen_t(x: Tensor) -> Tensor:
            return torch.nn.functional.pad(x, (0, pad_t), value=0)

        data = {
            "input_ids": widen(gen.input_ids, pad_id),
            "attention_mask": widen(gen.attention_mask, 0),
            "completion_mask": widen_t(cm),
            "mask": widen_t(valid.long()).bool(),
            "rewards": rewards * widen_t(valid.long()).float(),
            "logp": widen_t(gen.logp),
        }
        lengths = cm.sum(1).float()
        sampled, sampled_tokens = b, float(lengths.sum())
        branch_metrics: dict[str, float] = {}
        group_rows = self.group_size
        if branches is not None:
            bmask, bvalue, branch_metrics, cont = branches
            data["branch_mask"] = widen_t(bmask.long()).bool() & data["mask"]
            data["branch_value"] = widen_t(bvalue)
            sampled += int(branch_metrics["rollout/branch_completions"])
            sampled_tokens += branch_metrics["rollout/branch_tokens"]
            branch_metrics["time/branch_s"] = t_branch - t_score
            if self.branch_train:
                data, group_rows = self._with_continuations(data, cont)
                branch_metrics["rollout/trained_rows"] = float(data["mask"].any(1).sum())
        # Every sampled completion counts, branch continuations included: env steps (total_steps,
        # the curves' x axis), time/sps and the throughput figures are honest about the cost.
        self.completions += sampled
        self.sampled_tokens += sampled_tokens
        self._timed_completions += sampled
        self._timed_tokens += sampled_tokens
        metrics: dict[str, float] = {
            "rollout/reward_mean": float(total.mean()),
            "rollout/reward_std": float(total.std()),
            "rollout/accuracy": float(acc.mean()),
            "rollout/completion_len_mean": float(lengths.mean()),
            "rollout/completion_len_max": float(lengths.max()),
            "rollout/truncated_frac": float(gen.truncated.float().mean()),
            "rollout/completion_tokens": float(lengths.sum()),
            "rollout/sampled_completions": float(sampled),
            "rollout/sampled_tokens": sampled_tokens,
            "rollout/sampled_tokens_total": self.sampled_tokens,
            "time/generate_s": t_gen - t0,
            "time/score_s": t_score - t_gen,
            "time/completions_per_s_generate": b / max(t_gen - t0, 1e-9),
            **branch_metrics,
        }
        for name, vals in per_fn.items():
            metrics[f"rollout/reward/{name}"] = float(vals.mean())
        self.updates += 1
        self._log_completions(prompts, texts, answers, total, acc)
        return Batch(data, group_rows, metrics)

    def _with_continuations(self, data: dict[str, Tensor], cont: dict[str, Tensor]) -> tuple[dict[str, Tensor], int]:
        """``text.branch_train``: the batch with every continuation as a member of its prompt's group.

        A group's rows become its ``G`` completions followed by ``G * branch_points * branch_size``
        slots for continuations. A continuation's row is its prompt, then its prefix and its own
        tokens as one completion; only its own tokens are trained (``mask``), and it carries the
        branch point at its start with the prefix's value, so the segment advantage of its tokens
        is its return minus that value (:func:`grpo_marl.advantages.segment_advantages`), and the
        continuations of one prefix are credited against each other, as the members of a prompt
        group are. Slots a completion did not fill (a completion too short to branch) are copies
        of the group's first completion with nothing to train (no valid token), so every batch has
        the same group size (dynamic sampling concatenates batches) and these rows drop out of the
        loss (:meth:`grpo_marl.algos.grpo.GRPO.rows_with_signal`).

        Returns the data and the new group size.
        """
        g, n_groups, dev = self.group_size, self.num_groups, self.device
        slots = g * self.branch_points * self.branch_size
        width = g + slots
        total = n_groups * width
        ar = torch.arange(total, device=dev)
        orig = torch.arange(n_groups * g, device=dev)
        orig_slot = (orig // g) * width + orig % g
        filler = (ar // width) * g  # the group's first completion
        out = {}
        for key, v in data.items():
            rows = v[filler].clone()
            if key in ("mask", "rewards", "branch_mask", "branch_value", "logp"):
                rows.zero_()
            rows[orig_slot] = v
            out[key] = rows
        src = cont["src"]
        n = int(src.numel())
        if n:
            grp = src // g
            first = torch.searchsorted(grp, grp)  # src ascends, so a group's continuations are contiguous
            slot = grp * width + g + (torch.arange(n, device=dev) - first)
            pw, t_len = self.prompt_width, self.max_new_tokens
            col = torch.arange(t_len, device=dev)[None, :]
            start = cont["starts"][:, None]
            cmask = cont["mask"].long()
            own = cmask.bool() & (col >= start)
            if self.mask_truncated:
                own = own & ~cont["truncated"][:, None]
            out["input_ids"][slot] = torch.cat([data["input_ids"][src, :pw], cont["ids"]], 1)
            out["attention_mask"][slot] = torch.cat([data["attention_mask"][src, :pw], cmask], 1)
            out["completion_mask"][slot] = cmask
            out["mask"][slot] = own
            last = (cmask.sum(1) - 1).clamp_min(0)
            rewards = torch.zeros((n, t_len), dtype=out["rewards"].dtype, device=dev)
            rewards[torch.arange(n, device=dev), last] = cont["returns"].to(rewards.dtype)
            out["rewards"][slot] = rewards * own.to(rewards.dtype)
            c_logp = cont["logp"]  # [n, >= 1]: every continuation has a token
            logp = c_logp.gather(1, (col - start).clamp(0, c_logp.shape[1] - 1)).to(out["logp"].dtype)
            out["logp"][slot] = torch.where(own, logp, torch.zeros_like(logp))
            out["branch_mask"][slot] = (col == start) & own
            out["branch_value"][slot] = torch.where(
                col == start, cont["values"][:, None].to(out["branch_value"].dtype), torch.zeros_like(rewards)
            )
        return out, width

    def _branch(
        self, policy: TextPolicy, gen: Generation, prompts: list[str], answers: list[str]
    ) -> tuple[Tensor, Tensor, dict[str, float], dict[str, Tensor]]:
        """State groups: ``text.branch_size`` continuations from prefixes of every completion.

        The branch points come from ``text.branch_rule`` (:func:`grpo_marl.text.branching.branch_points`);
        all continuations are sampled in one decode loop over the completions' own KV cache
        (:meth:`~grpo_marl.policies.llm.LLMPolicy.branch`), each within what is left of the
        completion budget, and scored as whole completions (prefix + continuation). Returns
        ``branch_mask[B, T]`` (a branch point before token t), ``branch_value[B, T]`` (the mean
        reward of its continuations: the prefix's Monte-Carlo value), the branch metrics and the
        continuations themselves (``src`` completion, ``starts``, joined ``ids``/``mask``, their own
        tokens' ``logp``, ``truncated``, ``returns``, their prefix's ``values``).

        By default the continuations are value estimates only, not trained on: their reward reaches
        the prefix's tokens through the segment advantages, the batch keeps its one-row-per-completion
        groups, and the loss's token count is that of the prompt groups (VinePPO's choice too).
        ``text.branch_train=true`` also trains on them (:meth:`_with_continuations`; TreeRL's and
        TreePO's choice): the tokens spent on branches then feed the gradient as well.
        """
        b, t_len = gen.completion_mask.shape
        dev = gen.completion_mask.device
        bmask = torch.zeros((b, t_len), dtype=torch.bool, device=dev)
        bvalue = torch.zeros((b, t_len), dtype=torch.float32, device=dev)
        rows, starts = branch_points(
            gen.lengths, rule=self.branch_rule, every=self.branch_every, points=self.branch_points, entropy=gen.entropy
        )
        metrics = {
            "rollout/branch_points": float(rows.numel()),
            "rollout/branch_completions": 0.0,
            "rollout/branch_tokens": 0.0,
        }
        cont: dict[str, Tensor] = {"src": torch.zeros(0, dtype=torch.long, device=dev)}
        if rows.numel() == 0:
            return bmask, bvalue, metrics, cont
        k = self.branch_size
        br = policy.branch(
            gen,
            rows,
            starts,
            num_samples=k,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            generator=self.generator,
        )
        rep_rows, rep_starts = rows.repeat_interleave(k), starts.repeat_interleave(k)
        ids, mask = join_continuations(
            gen.completion_ids[rep_rows], rep_starts, br.completion_ids, br.completion_mask, self.max_new_tokens,
            policy.pad_id,
        )  # fmt: skip
        texts = policy.decode(ids, mask)
        src = rep_rows.tolist()
        total, _, acc = self.text_task.score([prompts[i] for i in src], texts, [answers[i] for i in src])
        values = torch.as_tensor(total, dtype=torch.float32, device=dev).reshape(-1, k).mean(1)
        bmask[rows, starts] = True
        bvalue[rows, starts] = values
        metrics.update({
            "rollout/branch_completions": float(br.completion_mask.shape[0]),
            "rollout/branch_tokens": float(br.completion_mask.sum()),
            "rollout/branch_start_mean": float(starts.float().mean()),
            "rollout/branch_accuracy": float(acc.mean()),
            "rollout/branch_value_mean": float(values.mean()),
        })  # fmt: skip
        cont = {
            "src": rep_rows,
            "starts": rep_starts,
            "ids": ids,
            "mask": mask,
            "logp": br.logp,
            "truncated": br.truncated,
            "returns": torch.as_tensor(total, dtype=torch.float32, device=dev),
            "values": values.repeat_interleave(k),
        }
        return bmask, bvalue, metrics, cont

    def _log_completions(
        self, prompts: list[str], texts: list[str], answers: list[str], total: np.ndarray, acc: np.ndarray
    ) -> None:
        every, n = self.log_every, self.log_n
        if self.run_dir is None or every <= 0 or n <= 0 or (self.updates - 1) % every:
            return
        # One completion from each of the first n groups: different prompts, not n copies of one.
        rows = [g * self.group_size for g in range(min(n, len(prompts) // self.group_size))]
        records: list[dict[str, Any]] = [
            {
                "step": self.completions,
                "update": self.updates,
                "prompt": prompts[i],
                "completion": texts[i],
                "answer": answers[i],
                "reward": float(total[i]),
                "correct": bool(acc[i]),
            }
            for i in rows
        ]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "completions.jsonl", "a") as f:  # appended, never overwritten
            f.writelines(json.dumps(r) + "\n" for r in records)
        if self.logger is not None:

            def cell(s: str) -> str:
                return "`" + s.replace("`", "'").replace("|", "\\|").replace("\n", "⏎") + "`"

            table = "| prompt | completion | answer | reward |\n|---|---|---|---|\n" + "\n".join(
                f"| {cell(r['prompt'])} | {cell(r['completion'])} | {cell(r['answer'])} | {r['reward']:.3f} |"
                for r in records
            )
            self.logger.text("rollout/completions", table, self.completions)

    # -- scoring ---------------------------------------------------------------------------------
    def log_prob(
        self, policy: SequenceScorer, mb: dict[str, Tensor], need_entropy: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Completion log-probs ``[mb, T]`` in one forward, over only the columns this minibatch
        uses (all-padding prompt columns and all-masked completion columns are cut, then the
        result is zero-padded back to ``T``)."""
        ids, attn, cm = mb["input_ids"], mb["attention_mask"], mb["completion_mask"]
        t_full = cm.shape[1]
        p = ids.shape[1] - t_full
        used = cm.any(0)
        t_used = int(used.nonzero().max()) + 1 if bool(used.any()) else 1
        first = int(attn[:, :p].any(0).long().argmax())
        ids = ids[:, first : p + t_used]
        attn = attn[:, first : p + t_used]
        # Entropy is always computed (it is cheap next to the forward) so train/entropy is logged
        # even without an entropy bonus; detached then, so it adds nothing to the backward pass.
        logp, ent = policy.completion_logprobs(
            ids, attn, cm[:, :t_used], temperature=self.temperature, with_entropy=True
        )
        if not need_entropy and ent is not None:
            ent = ent.detach()
        if t_used < t_full:
            logp = torch.nn.functional.pad(logp, (0, t_full - t_used))
            ent = None if ent is None else torch.nn.functional.pad(ent, (0, t_full - t_used))
        return logp, ent

    def end_update(self, batch: Batch) -> None:
        """After the optimizer step: close the update's throughput clock (no observation
        statistics to update in text)."""
        if self._t_update is not None:
            self._step_times.append(time.perf_counter() - self._t_update)
            self._cpu_times.append(time.process_time() - self._c_update)
            self._t_update = None

    def eval_capacity(self) -> int:
        """The held-out prompts: one prompt is one evaluation episode."""
        return len(self.eval_set)

    @torch.no_grad()
    def evaluate(self, policy: TextPolicy, episodes: int, seed_offset: int = 0) -> dict[str, float]:
        """Greedy completions for the eval split (``text.eval_prompts`` of them, 0 = all); one
        prompt is one episode. Returns accuracy, reward (as ``return``) and per-function means."""
        n = self.eval_limit or int(self.cfg.text.eval_prompts) or len(self.eval_set)
        n = min(n, len(self.eval_set))
        chunk = max(1, int(self.cfg.text.eval_batch))
        totals, accs, lengths = [], [], []
        per: dict[str, list[np.ndarray]] = {}
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            ids, mask = self._trim_left(self._eval_ids[start:stop], self._eval_mask[start:stop])
            gen = policy.generate(ids, mask, max_new_tokens=self.max_new_tokens, greedy=True)
            texts = policy.decode(gen.completion_ids, gen.completion_mask)
            total, per_fn, acc = self.text_task.score(
                list(self.eval_set.prompts[start:stop]), texts, list(self.eval_set.answers[start:stop])
            )
            totals.append(total)
            accs.append(acc)
            lengths.append(gen.completion_mask.sum(1).float().cpu().numpy())
            for k, v in per_fn.items():
                per.setdefault(k, []).append(v)
        total = np.concatenate(totals)
        out = {
            "eval/accuracy": float(np.concatenate(accs).mean()),
            "eval/return_mean": float(total.mean()),
            "eval/return_std": float(total.std()),
            "eval/return_min": float(total.min()),
            "eval/return_max": float(total.max()),
            "eval/completion_len_mean": float(np.concatenate(lengths).mean()),
            "eval/episodes": float(n),
        }
        for k, v in per.items():
            out[f"eval/reward/{k}"] = float(np.concatenate(v).mean())
        return out

    # -- resume / end ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "rng": self.rng.bit_generator.state,
            "order": self._order.copy(),
            "prompt_acc": self._prompt_acc.copy(),
            "pos": self._pos,
            "completions": self.completions,
            "sampled_tokens": self.sampled_tokens,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.rng.bit_generator.state = state["rng"]
        self._order = np.asarray(state["order"], dtype=np.int64)
        self._pos = int(state["pos"])
        if "prompt_acc" in state:
            self._prompt_acc = np.asarray(state["prompt_acc"], dtype=np.float64)
        self.completions = int(state["completions"])
        self.sampled_tokens = float(state.get("sampled_tokens", 0.0))
        self.updates = int(state["updates"])

    def finish(self, run_dir: Path, is_main: bool) -> dict[str, Any]:
        """At the end of training: save the policy as a plain HF model dir in ``run_dir/model``
        (``model.save``; LoRA merged unless ``model.lora.save_adapter``), so
        ``model.path=<run_dir>/model`` reloads it, and report where it is."""
        if self._finished is not None:
            return self._finished
        out: dict[str, Any] = {}
        if is_main and bool(self.cfg.model.save):
            merge = not bool(self.cfg.model.lora.save_adapter)
            out["model_dir"] = str(self.policy.save_pretrained(Path(run_dir) / "model", merge_lora=merge))
        self._finished = out
        return out

    def summary_extra(self) -> dict[str, Any]:
        """Task, completion budget, warm-start and throughput figures for ``summary.json``."""
        out: dict[str, Any] = {
            "text/task": self.text_task.name,
            "text/max_new_tokens": self.max_new_tokens,
            "text/chat_template": self.chat_template,
            **self.sft_stats,
            **throughput_summary(
                self._step_times, self._timed_completions, self._timed_tokens, self.device, self._cpu_times
            ),
        }
        return out

    def close(self) -> None:
        self.env.close()


__all__ = ["TextTask", "build_policy", "throughput_summary"]
