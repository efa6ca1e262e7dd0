"""Optional supervised warm start of a text policy before GRPO (``text.sft_steps > 0``).

Teacher-forced training on the train split's reference answers, with its own AdamW (the RL
optimizer starts fresh afterwards); it never sees the eval split. Decoupled weight decay
(``text.sft_weight_decay``) is what lets a tiny model trained on a small split generalise to
held-out prompts instead of memorising the training answers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from grpo_marl.policies.llm import LLMPolicy


def trim_left(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Drop prompt columns that are padding in every row (left padding of a sub-batch)."""
    first = int(mask.any(0).long().argmax())
    return ids[:, first:], mask[:, first:]


def teacher_forced(
    policy: LLMPolicy, prompt_ids: Tensor, prompt_mask: Tensor, answers: Sequence[str]
) -> tuple[Tensor, Tensor, Tensor]:
    """``(input_ids, attention_mask, completion_mask)`` for left-padded prompts + their reference
    answers (+ EOS), in the sampler's layout, so the policy's scorer gives their log-likelihood."""
    enc = policy.tokenizer(list(answers), add_special_tokens=False)["input_ids"]
    t_len = max(len(x) for x in enc) + 1
    comp = torch.full((len(enc), t_len), policy.pad_id, dtype=torch.long)
    cmask = torch.zeros((len(enc), t_len), dtype=torch.long)
    for r, ids in enumerate(enc):
        comp[r, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        comp[r, len(ids)] = policy.eos_id
        cmask[r, : len(ids) + 1] = 1
    p_ids, p_mask = trim_left(prompt_ids, prompt_mask)
    comp, cmask = comp.to(p_ids.device), cmask.to(p_ids.device)
    return torch.cat([p_ids, comp], 1), torch.cat([p_mask, cmask], 1), cmask


def sft_warm_start(
    policy: LLMPolicy,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    answers: Sequence[str],
    *,
    steps: int,
    lr: float,
    batch: int,
    weight_decay: float = 0.0,
    seed: int = 0,
) -> dict[str, float]:
    """``steps`` AdamW steps of answer NLL on random train batches; returns ``text/sft_*`` stats."""
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    rng = np.random.default_rng(seed + 17)
    n = len(answers)
    loss_val = float("nan")
    policy.train()
    t0 = time.perf_counter()
    for _ in range(steps):
        rows = rng.choice(n, size=min(batch, n), replace=False)
        sel = torch.as_tensor(rows, device=prompt_ids.device)
        ids, attn, cm = teacher_forced(policy, prompt_ids[sel], prompt_mask[sel], [answers[i] for i in rows])
        logp, _ = policy.completion_logprobs(ids, attn, cm)
        loss = -(logp.sum() / cm.sum())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_val = float(loss.detach())
    return {
        "text/sft_steps": float(steps),
        "text/sft_final_nll": loss_val,
        "text/sft_seconds": time.perf_counter() - t0,
    }
