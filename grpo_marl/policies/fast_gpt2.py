"""A lean forward pass for Hugging Face ``GPT2LMHeadModel``, used by :class:`~grpo_marl.policies.llm.LLMPolicy`.

For the tiny GPT-2 models trained from scratch on CPU, a sampling step is dominated by the
per-call Python overhead of the generic transformers stack (mask builders, cache objects, output
dataclasses, decorators), not by arithmetic. :class:`FastGPT2` computes the same thing over the
model's own parameters; :meth:`FastGPT2.supports` says when it applies, and every other model
takes the transformers forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class FastGPT2:
    """A lean forward pass for ``GPT2LMHeadModel`` over the model's own parameters.

    Why: for the tiny models trained from scratch on CPU, a step is dominated by per-call
    Python overhead of the generic transformers stack (mask builders, cache objects, output
    dataclasses, decorators), not by arithmetic. This is the same computation (LayerNorm,
    fused QKV, SDPA, GELU MLP, tied head) in ~15 ops per block with a plain list KV cache.
    It reads the HF modules at call time, so training, ``load_state_dict`` and deep copies all
    act on the one set of weights; tests check its logits against the HF forward. Used only
    when :meth:`supports` says the config has nothing it does not implement (no dropout, no
    attention-scaling variants, no cross-attention); everything else takes the HF path.
    """

    _ACTS: ClassVar[dict[str, Callable[[Tensor], Tensor]]] = {
        "gelu": lambda x: F.gelu(x),
        "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "relu": F.relu,
        "silu": F.silu,
        "swish": F.silu,
    }

    def __init__(self, model: nn.Module) -> None:
        # a transformers GPT2LMHeadModel: its submodules are invisible to nn.Module's typing
        hf: Any = model
        self.model = hf
        cfg = hf.config
        self.n_head = int(cfg.n_head)
        self.eps = float(cfg.layer_norm_epsilon)
        self.act = self._ACTS[cfg.activation_function]

    @classmethod
    def supports(cls, model: nn.Module) -> bool:
        try:
            from transformers import GPT2LMHeadModel
        except ImportError:  # pragma: no cover
            return False
        if type(model) is not GPT2LMHeadModel:
            return False
        c = model.config
        return (
            c.activation_function in cls._ACTS
            and bool(c.scale_attn_weights)
            and not c.scale_attn_by_inverse_layer_idx
            and not c.reorder_and_upcast_attn
            and not getattr(c, "add_cross_attention", False)
            and float(c.resid_pdrop) == 0.0
            and float(c.embd_pdrop) == 0.0
            and float(c.attn_pdrop) == 0.0
        )

    def __call__(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        key_valid: Tensor | None,
        cache: list[tuple[Tensor, Tensor]] | None = None,
        logits_to_keep: int = 0,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """Logits of the last ``logits_to_keep`` positions (0 = all) and the updated KV cache.

        ``key_valid[B, S]`` marks attendable keys over cache + new tokens (None = all valid).
        """
        tr = self.model.transformer
        b, n = input_ids.shape
        x = tr.wte(input_ids) + tr.wpe(position_ids)
        past = 0 if not cache else cache[0][0].shape[2]
        s = past + n
        mask = None
        if key_valid is not None or (past and n > 1):
            allowed = torch.ones((n, s), dtype=torch.bool, device=x.device).tril(past)
            if key_valid is not None:
                allowed = allowed[None] & key_valid[:, None, :].bool()
                # A query with no attendable key (a padding position) would give NaN, which then
                # leaks through 0 * NaN into real rows; let it attend to itself instead.
                own = torch.zeros((n, s), dtype=torch.bool, device=x.device)
                ar = torch.arange(n, device=x.device)
                own[ar, ar + past] = True
                allowed = allowed | own[None]
                allowed = allowed[:, None]
            mask = allowed
        causal = mask is None and past == 0 and n > 1
        d = x.shape[-1]
        hd = d // self.n_head
        new_cache: list[tuple[Tensor, Tensor]] = []
        for i, blk in enumerate(tr.h):
            h = F.layer_norm(x, (d,), blk.ln_1.weight, blk.ln_1.bias, self.eps)
            qkv = torch.addmm(blk.attn.c_attn.bias, h.reshape(-1, d), blk.attn.c_attn.weight)
            q, k, v = qkv.view(b, n, 3, self.n_head, hd).permute(2, 0, 3, 1, 4).unbind(0)
            if cache:
                k = torch.cat([cache[i][0], k], 2)
                v = torch.cat([cache[i][1], v], 2)
            new_cache.append((k, v))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
            o = o.transpose(1, 2).reshape(-1, d)
            x = x + torch.addmm(blk.attn.c_proj.bias, o, blk.attn.c_proj.weight).view(b, n, d)
            h = F.layer_norm(x, (d,), blk.ln_2.weight, blk.ln_2.bias, self.eps).reshape(-1, d)
            h = self.act(torch.addmm(blk.mlp.c_fc.bias, h, blk.mlp.c_fc.weight))
            x = x + torch.addmm(blk.mlp.c_proj.bias, h, blk.mlp.c_proj.weight).view(b, n, d)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        x = F.layer_norm(x, (d,), tr.ln_f.weight, tr.ln_f.bias, self.eps)
        return F.linear(x, self.model.lm_head.weight), new_cache

    @staticmethod
    def repeat_cache(cache: list[tuple[Tensor, Tensor]], n: int) -> list[tuple[Tensor, Tensor]]:
        return [(k.repeat_interleave(n, 0), v.repeat_interleave(n, 0)) for k, v in cache]
