"""A causal-LM policy for GRPO on text: batched sampling with a KV cache and one-pass log-probs.

Any ``AutoModelForCausalLM`` + tokenizer loads from a local directory (or a hub name where the
user has network). Two operations matter for speed and correctness:

* :meth:`LLMPolicy.generate` samples completions for a batch of prompts with our own decode
  loop over the model's KV cache (one forward per new token for the whole batch, sampling and
  EOS bookkeeping as tensor ops, early exit once every row has stopped). It also returns the
  behaviour log-probs of the sampled tokens under the *temperature-scaled* distribution, which is
  exactly what :meth:`completion_logprobs` recomputes, so on-policy ratios start at 1 without a
  second forward pass.
* :meth:`LLMPolicy.completion_logprobs` scores prompt+completion in ONE forward pass, keeping
  logits only for completion positions (``logits_to_keep``) and masking prompt, padding and
  post-EOS tokens.

Layout (shared with the Task): prompts are LEFT-padded to ``P`` tokens, completions RIGHT-padded
to ``T`` tokens; ``input_ids = [prompt | completion]`` is ``[B, P+T]``; ``completion_mask[B, T]``
is 1 for sampled tokens up to and including the first EOS. Position ids are derived from the
attention mask so left padding does not shift positions.

The reference policy for the KL term (:meth:`LLMPolicy.make_reference`, called by the GRPO
algorithm) is a frozen copy, or with LoRA (peft) the same weights with the adapter disabled -
no second model in memory.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


#: Logit given to tokens that are never sampled: finite (so 0 * logit stays 0 in the entropy)
#: yet exp() underflows to exactly 0 in float32.
NEG_LOGIT = -1e9


@dataclass
class LoraSpec:
    """LoRA adapter settings (needs ``peft``)."""

    r: int = 16
    """Adapter rank."""
    alpha: int = 32
    """Scaling numerator (effective scale alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: str | list[str] = "all-linear"
    """Modules to adapt (peft syntax)."""


@dataclass
class Generation:
    """Sampled completions for a batch of prompts (see the module docstring for the layout)."""

    input_ids: Tensor
    """``[B, P+T]`` prompt (left-padded) followed by completion (right-padded with pad)."""
    attention_mask: Tensor
    """``[B, P+T]`` 1 for real prompt tokens and completion tokens up to and including EOS."""
    completion_mask: Tensor
    """``[B, T]`` 1 for completion tokens up to and including the first EOS."""
    logp: Tensor
    """``[B, T]`` log-prob of each sampled token under the temperature-scaled policy (0 if masked)."""
    truncated: Tensor
    """``[B]`` True where no EOS appeared within ``max_new_tokens``."""
    prompt_len: int
    """``P``: width of the prompt block."""

    @property
    def completion_ids(self) -> Tensor:
        """``[B, T]`` the completion block of ``input_ids``."""
        return self.input_ids[:, self.prompt_len :]

    @property
    def lengths(self) -> Tensor:
        """``[B]`` completion lengths in tokens (EOS included)."""
        return self.completion_mask.sum(1)


def _cache_kwarg(model: nn.Module) -> str:
    """``cache`` (transformers >= 5.x) or ``past_key_values`` (older), whichever forward takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _out_cache(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids that count only attended tokens (left padding gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Set logits outside the smallest nucleus with mass >= ``top_p`` to -inf (keeps the top-1)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    # Drop a token when the mass strictly before it already reaches top_p.
    drop_sorted = (probs.cumsum(-1) - probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class LLMPolicy(nn.Module):
    """Hugging Face causal LM + tokenizer as a GRPO policy.

    With ``lora`` set only the adapter is trained and :meth:`make_reference` returns the
    adapter-disabled base model; otherwise the reference is a frozen copy.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        lora: LoraSpec | None = None,
        gradient_checkpointing: bool = False,
        fast_path: bool = True,
    ) -> None:
        super().__init__()
        if tokenizer.pad_token_id is None:
            # Many causal LMs ship without a pad token; EOS is safe since padding is masked.
            tokenizer.pad_token = tokenizer.eos_token
        if tokenizer.eos_token_id is None:
            raise ValueError("LLMPolicy: the tokenizer has no eos_token; completions could never stop")
        tokenizer.padding_side = "left"
        self.tokenizer = tokenizer
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)
        self.lora = lora
        if lora is not None:
            try:
                from peft import LoraConfig, get_peft_model
            except ImportError as e:  # pragma: no cover - peft is an optional extra
                raise ImportError("model.lora needs the optional 'peft' package: pip install peft") from e
            cfg = LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=lora.target_modules,
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, cfg)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if lora is not None and hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()
        self.model = model
        self._cache_kw = _cache_kwarg(model)
        self._decode_cache: dict[tuple[int, ...], str] = {}
        self.fast = FastGPT2(model) if (fast_path and not gradient_checkpointing and FastGPT2.supports(model)) else None
        # Tokens a completion must never contain: padding, <unk>, and ids past the tokenizer
        # (padded embedding rows of real checkpoints). Sampling and scoring both mask them, so the
        # behaviour and training distributions stay identical; a tiny model trained from scratch
        # also explores faster without them.
        vocab = int(model.get_output_embeddings().weight.shape[0])
        never = torch.zeros(vocab, dtype=torch.bool)
        never[min(len(tokenizer), vocab) :] = True
        for tid in (tokenizer.pad_token_id, getattr(tokenizer, "unk_token_id", None)):
            if tid is not None and tid != self.eos_id and tid < vocab:
                never[tid] = True
        self.register_buffer("never_ids", never.to(next(model.parameters()).device), persistent=False)

    # ------------------------------------------------------------------ construction / io

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = "auto",
        lora: LoraSpec | None = None,
        gradient_checkpointing: bool = False,
        trust_remote_code: bool = False,
    ) -> LLMPolicy:
        """Load model + tokenizer from a directory (or hub name). ``dtype="auto"`` picks bf16 on
        CUDA and fp32 on CPU (bf16 matmuls are slow on most CPUs and tiny models gain nothing)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = torch.device(device)
        torch_dtype = resolve_dtype(dtype, device)
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch_dtype, trust_remote_code=trust_remote_code
        ).to(device)
        return cls(model, tok, lora=lora, gradient_checkpointing=gradient_checkpointing)

    def save_pretrained(self, path: str | Path, *, merge_lora: bool = True) -> Path:
        """Write an HF model dir that ``from_pretrained``/``model.path=`` reloads. LoRA adapters are
        merged into a copy of the base weights by default so the result is a plain model."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        model = self.model
        if self.lora is not None and merge_lora:
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        return out

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def make_reference(self) -> nn.Module:
        """The reference policy for the KL term (called once by the GRPO algorithm).

        Full fine-tuning: a frozen deep copy. LoRA: a parameter-free view that scores with the
        adapter disabled, i.e. the base model - no second copy of the weights in memory.
        """
        if self.lora is not None:
            return AdapterDisabledReference(self)
        ref = copy.deepcopy(self)
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    # ------------------------------------------------------------------ tokenization

    def encode_prompts(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Tokenize and left-pad prompts: ``(ids[N, P], mask[N, P])`` on the policy's device."""
        enc = self.tokenizer(list(prompts), padding=True, return_tensors="pt", padding_side="left")
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    def decode(self, completion_ids: Tensor, completion_mask: Tensor) -> list[str]:
        """Completion texts (EOS and padding dropped) for ``[B, T]`` ids and their mask.

        Memoized per distinct token sequence: group members and successive updates repeat
        completions a lot (all of them, once a policy converges), and the tokenizer's Python
        decode is otherwise a visible share of a tiny model's update.
        """
        lengths = (completion_mask.sum(1) - (completion_ids == self.eos_id).any(1).long()).tolist()
        rows = completion_ids.tolist()
        keys = [tuple(r[:n]) for r, n in zip(rows, lengths)]
        cache = self._decode_cache
        missing = list({k for k in keys if k not in cache})
        if missing:
            if len(cache) + len(missing) > 200_000:
                cache.clear()
            texts = self.tokenizer.batch_decode([list(k) for k in missing], skip_special_tokens=True)
            cache.update(zip(missing, texts))
        return [cache[k] for k in keys]

    # ------------------------------------------------------------------ sampling

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        greedy: bool = False,
        num_samples: int = 1,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """Sample ``num_samples`` completions per prompt (rows of one prompt are contiguous).

        Prompts are prefilled once and the KV cache is repeated ``num_samples`` times, so a group
        of G completions costs one prompt forward, not G. Sampling stops at EOS per row (later
        tokens are padding, masked out) and the loop exits as soon as every row has stopped.
        """
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if not greedy and temperature <= 0:
            raise ValueError("temperature must be > 0 for sampling (use greedy=True for argmax)")
        model = self.model
        was_training = model.training
        # Sampling must not use dropout; the fast path has none, and toggling train/eval on a
        # transformers model walks every submodule (milliseconds per update for tiny models).
        toggle = was_training and self.fast is None
        if toggle:
            model.eval()
        try:
            return self._generate(
                model, prompt_ids, prompt_mask, max_new_tokens, temperature, top_p, greedy, num_samples, generator
            )
        finally:
            if toggle:
                model.train(was_training)

    def _generate(
        self,
        model: nn.Module,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        greedy: bool,
        num_samples: int,
        generator: torch.Generator | None,
    ) -> Generation:
        n, p_len = prompt_ids.shape
        b = n * num_samples
        dev = prompt_ids.device
        padded = bool((prompt_mask == 0).any())
        pos = positions_from_mask(prompt_mask)
        fast = self.fast if (self.fast is not None and model is self.model) else None
        kw: dict[str, Any] = {"use_cache": True, "logits_to_keep": 1}
        if fast is not None:
            logits, cache = fast(prompt_ids, pos, prompt_mask if padded else None, None, logits_to_keep=1)
        else:
            out = model(
                input_ids=prompt_ids,
                attention_mask=prompt_mask if padded else None,
                position_ids=pos,
                **kw,
            )
            cache, logits = _out_cache(out), out.logits
        logits = logits[:, -1]
        if num_samples > 1:
            if fast is not None:
                cache = fast.repeat_cache(cache, num_samples)
            else:
                cache.batch_repeat_interleave(num_samples)
            logits = logits.repeat_interleave(num_samples, 0)
            prompt_mask = prompt_mask.repeat_interleave(num_samples, 0)
            prompt_ids = prompt_ids.repeat_interleave(num_samples, 0)
            pos = pos.repeat_interleave(num_samples, 0)
        next_pos = pos[:, -1:] + 1
        tokens = torch.full((b, max_new_tokens), self.pad_id, dtype=torch.long, device=dev)
        logps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        alive_len = torch.zeros(b, dtype=torch.long, device=dev)
        attn = torch.cat([prompt_mask, torch.ones((b, max_new_tokens), dtype=prompt_mask.dtype, device=dev)], 1)
        inv_t = 1.0 if greedy else 1.0 / temperature
        steps = 0
        for t in range(max_new_tokens):
            scaled = logits.float().mul(inv_t).masked_fill(self.never_ids, NEG_LOGIT)
            logprobs = scaled.log_softmax(-1)
            if greedy:
                tok = scaled.argmax(-1)
            else:
                filt = top_p_filter(scaled, top_p)
                probs = filt.softmax(-1)
                tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            tok = tok.masked_fill(done, self.pad_id)
            tokens[:, t] = tok
            logps[:, t] = logprobs.gather(1, tok[:, None]).squeeze(1).masked_fill(done, 0.0)
            alive_len += (~done).long()
            done = done | (tok == self.eos_id)
            steps = t + 1
            if t + 1 == max_new_tokens or bool(done.all()):
                break
            # Stopped rows feed EOS (their outputs are ignored); feeding the pad id without a
            # mask makes transformers warn about unmasked padding.
            step_ids = tok.masked_fill(done, self.eos_id)[:, None]
            step_mask = attn[:, : p_len + t + 1] if padded else None
            if fast is not None:
                logits, cache = fast(step_ids, next_pos, step_mask, cache, logits_to_keep=1)
            else:
                out = model(
                    input_ids=step_ids,
                    attention_mask=step_mask,
                    position_ids=next_pos,
                    **{self._cache_kw: cache},
                    **kw,
                )
                cache, logits = _out_cache(out), out.logits
            logits = logits[:, -1]
            next_pos = next_pos + 1
        tokens = tokens[:, :steps]
        logps = logps[:, :steps]
        ar = torch.arange(steps, device=dev)
        completion_mask = (ar[None, :] < alive_len[:, None]).long()
        truncated = ~done
        return Generation(
            input_ids=torch.cat([prompt_ids, tokens], 1),
            attention_mask=torch.cat([prompt_mask.long(), completion_mask], 1),
            completion_mask=completion_mask,
            logp=logps,
            truncated=truncated,
            prompt_len=p_len,
        )

    # ------------------------------------------------------------------ scoring

    def completion_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        completion_mask: Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        model: nn.Module | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (and entropies) of the completion tokens in one forward pass.

        ``input_ids``/``attention_mask`` are ``[B, P+T]``, ``completion_mask`` is ``[B, T]``.
        Returns ``logp[B, T]`` (0 where masked) and ``entropy[B, T]`` or None. Only the last
        ``T + 1`` positions go through the LM head. ``model`` overrides the scoring model (the
        reference); default is the trained model.
        """
        model = self.model if model is None else model
        t_len = completion_mask.shape[1]
        pos = positions_from_mask(attention_mask)
        padded = bool((attention_mask == 0).any())
        if self.fast is not None and model is self.model:
            logits, _ = self.fast(input_ids, pos, attention_mask if padded else None, None, logits_to_keep=t_len + 1)
        else:
            logits = model(
                input_ids=input_ids,
                attention_mask=attention_mask if padded else None,
                position_ids=pos,
                use_cache=False,
                logits_to_keep=t_len + 1,
            ).logits
        # Logits at position j predict token j+1: the T completion tokens are predicted by the
        # T positions before them (last prompt token .. second-to-last completion token).
        logits = logits[:, :-1].float()
        if temperature != 1.0:
            logits = logits / temperature
        logits = logits.masked_fill(self.never_ids, NEG_LOGIT)
        targets = input_ids[:, -t_len:]
        logz = logits.logsumexp(-1)
        logp = logits.gather(-1, targets[..., None]).squeeze(-1) - logz
        mask = completion_mask.to(logp.dtype)
        logp = logp * mask
        entropy = None
        if with_entropy:
            probs = (logits - logz[..., None]).exp()
            entropy = (logz - (probs * logits).sum(-1)) * mask
        return logp, entropy

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, completion_mask: Tensor, temperature: float = 1.0
    ) -> tuple[Tensor, Tensor | None]:
        """Alias of :meth:`completion_logprobs` with entropy (so the policy is a normal module)."""
        return self.completion_logprobs(
            input_ids, attention_mask, completion_mask, temperature=temperature, with_entropy=True
        )


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

    _ACTS = {
        "gelu": lambda x: F.gelu(x),
        "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "relu": F.relu,
        "silu": F.silu,
        "swish": F.silu,
    }

    def __init__(self, model: nn.Module) -> None:
        cfg = model.config
        self.model = model
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


class AdapterDisabledReference(nn.Module):
    """Reference policy of a LoRA-tuned :class:`LLMPolicy`: its base model (adapter disabled).

    Holds no parameters of its own (the policy is kept outside the module tree, so freezing or
    checkpointing this object never touches the adapter being trained).
    """

    def __init__(self, policy: LLMPolicy) -> None:
        super().__init__()
        self._policy = (policy,)

    def completion_logprobs(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        """:meth:`LLMPolicy.completion_logprobs` of the base model."""
        policy = self._policy[0]
        with policy.model.disable_adapter():
            return policy.completion_logprobs(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        return self.completion_logprobs(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Accept only the (empty) state of another adapter-disabled reference."""
        if len(state_dict):
            raise ValueError(
                "the LoRA reference is the frozen base model and cannot be refreshed from the "
                "policy; use algo.ref_refresh=0 with model.lora"
            )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(policy || reference): ``exp(r - l) - (r - l) - 1`` (>= 0)."""
    d = ref_logp - logp
    return (d.exp() - d - 1.0) * mask.to(logp.dtype)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 elsewhere; otherwise a torch dtype or its name."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        value = getattr(torch, str(dtype))
    except AttributeError as e:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16") from e
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return value

