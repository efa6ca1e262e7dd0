"""A causal-LM policy for GRPO on text: batched sampling with a KV cache and one-pass log-probs.

Any ``AutoModelForCausalLM`` + tokenizer works: a local model directory, a ``.gguf`` file or a hub
name (see :mod:`grpo_marl.text.loading`). Three operations matter for speed and correctness:

* :meth:`LLMPolicy.generate` samples completions for a batch of prompts with our own decode
  loop over the model's KV cache: each prompt is prefilled once and its cache repeated for the
  ``G`` samples of its group, then one forward per new token for the whole batch, with sampling
  and EOS bookkeeping as tensor ops and an early exit once every row has stopped. It also returns
  the behaviour log-probs of the sampled tokens under the *temperature-scaled* distribution,
  which is exactly what :meth:`completion_logprobs` recomputes, so on-policy ratios start at 1
  without a second forward pass.
* :meth:`LLMPolicy.completion_logprobs` scores prompt+completion with the prompt/padding/post-EOS
  tokens masked. Rows that share a prompt (the members of a GRPO group) share its forward pass
  too: the distinct prompts run once and their KV cache is indexed out to every row, so the
  completions are the only per-row work (gradients flow back through the shared cache).
* Token log-probs come from :func:`selective_logprobs`: the LM head, log-softmax, target gather
  and entropy in row chunks, recomputed in the backward pass, so the full ``[rows, vocab]``
  float32 log-softmax (hundreds of MB for a 50k vocabulary) is never kept for autograd.

Layout (shared with the Task): prompts are LEFT-padded to ``P`` tokens, completions RIGHT-padded
to ``T`` tokens; ``input_ids = [prompt | completion]`` is ``[B, P+T]``; ``completion_mask[B, T]``
is 1 for sampled tokens up to and including the first stop token. Position ids are derived from
the attention mask so left padding does not shift positions.

The reference policy for the KL term (:meth:`LLMPolicy.reference`) is a frozen copy, or with LoRA
(peft) the same weights with the adapter disabled - no second model in memory.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from grpo_marl import stopping
from grpo_marl.policies.fast_gpt2 import FastGPT2

#: Logit given to tokens that are never sampled: finite (so 0 * logit stays 0 in the entropy)
#: yet exp() underflows to exactly 0 in float32.
NEG_LOGIT = -1e9

#: Architectures whose logits are exactly ``lm_head(last_hidden_state)`` (no soft-capping or
#: logit scaling), so scoring can run the decoder and the LM head separately.
HEAD_SPLIT_MODEL_TYPES = frozenset(
    {"llama", "qwen2", "qwen3", "mistral", "gpt2", "phi3", "olmo", "olmo2", "smollm3", "starcoder2"}
)


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
    entropy: Tensor | None = None
    """``[B, T]`` entropy of each sampled token's (temperature-scaled) distribution, when asked."""
    cache: Any = field(default=None, repr=False)
    """The final KV cache (``generate(..., keep_cache=True)``), for :meth:`LLMPolicy.branch`."""

    @property
    def completion_ids(self) -> Tensor:
        """``[B, T]`` the completion block of ``input_ids``."""
        return self.input_ids[:, self.prompt_len :]

    @property
    def lengths(self) -> Tensor:
        """``[B]`` completion lengths in tokens (EOS included)."""
        return self.completion_mask.sum(1)


def _cache_kwarg(module: nn.Module) -> str:
    """``cache`` (transformers >= 5.x) or ``past_key_values`` (older), whichever forward takes.
    A peft wrapper's forward passes ``**kwargs`` on to its base model, so the base model decides
    (asking the wrapper chose ``past_key_values``, which transformers 5.x warns is deprecated)."""
    get_base = getattr(module, "get_base_model", None)
    target = get_base() if callable(get_base) else module
    params = inspect.signature(target.forward).parameters
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


def sample_rows(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row of ``probs[B, V]`` (rows need not be normalised), by inverting the CDF.

    Why not ``torch.multinomial``: on the CPU it draws a random number per vocabulary entry (an
    exponential race), 64 ms for 64 rows of a 49k vocabulary on one thread, a fifth of a small
    model's sampling step; this draws one uniform per row and costs a cumulative sum (2 ms). The
    CPU cumsum accumulates in double, so each token's chance is its probability to within ~1e-7.
    Zero-probability tokens (masked, or outside the nucleus) are never drawn: a token is chosen
    when ``cdf[i-1] <= u < cdf[i]``, an empty interval for them.
    """
    cdf = probs.cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_max_(probs.shape[1] - 1)


# ---------------------------------------------------------------------- selective log-softmax


def _chunk_rows(vocab: int) -> int:
    """Rows per chunk so one chunk's float32 logits stay around 32 MB."""
    return max(1, (1 << 23) // max(vocab, 1))


def _chunk_logits(h: Tensor, weight: Tensor, never: Tensor, inv_t: float) -> Tensor:
    z = (h @ weight.t()).float()
    if inv_t != 1.0:
        z = z * inv_t
    return z.masked_fill_(never, NEG_LOGIT)


class _SelectiveLogSoftmax(torch.autograd.Function):
    """``logp[n] = log softmax(h[n] W^T / temp)[target[n]]`` and the entropy, in row chunks.

    The backward pass recomputes each chunk's logits instead of keeping ``[N, V]`` tensors for
    autograd: memory is one chunk, compute is one extra head matmul.
    """

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, never: Tensor, inv_t: float, chunk: int
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ent = torch.empty_like(logp)
        lse = torch.empty_like(logp)
        for s in range(0, n, chunk):
            z = _chunk_logits(hidden[s : s + chunk], weight, never, inv_t)
            lz = z.logsumexp(-1)
            logp[s : s + chunk] = z.gather(1, targets[s : s + chunk, None]).squeeze(1) - lz
            p = (z - lz[:, None]).exp_()
            ent[s : s + chunk] = lz - (p * z).sum(-1)
            lse[s : s + chunk] = lz
        ctx.save_for_backward(hidden, weight, targets, never, lse, ent)
        ctx.inv_t, ctx.chunk = inv_t, chunk
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None) -> tuple[Any, ...]:
        hidden, weight, targets, never, lse, ent = ctx.saved_tensors
        inv_t, chunk = ctx.inv_t, ctx.chunk
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g_h = torch.empty_like(hidden) if need_h else None
        g_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            z = _chunk_logits(h, weight, never, inv_t)
            logq = z - lse[s : s + chunk, None]
            p = logq.exp()
            g_z = torch.zeros_like(z)
            if g_logp is not None:
                gl = g_logp[s : s + chunk]
                g_z -= p * gl[:, None]
                g_z.scatter_add_(1, targets[s : s + chunk, None], gl[:, None])
            if g_ent is not None:
                # dH/dz_j = -p_j (log p_j + H)
                g_z -= g_ent[s : s + chunk, None] * p * (logq + ent[s : s + chunk, None])
            g_z.masked_fill_(never, 0.0)
            if inv_t != 1.0:
                g_z *= inv_t
            g_z = g_z.to(weight.dtype)
            if g_h is not None:
                g_h[s : s + chunk] = g_z @ weight
            if g_w is not None:
                g_w += (g_z.t() @ h).float()
        return g_h, (None if g_w is None else g_w.to(weight.dtype)), None, None, None, None


def selective_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, never: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Log-probs of ``targets`` and entropies under ``softmax(hidden @ weight.T / temperature)``
    with the ``never`` token ids masked out, for ``hidden[..., d]`` / ``targets[...]``; the
    ``[..., V]`` logits only ever exist one row chunk at a time (forward and backward)."""
    shape = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    logp, ent = _SelectiveLogSoftmax.apply(
        h, weight, targets.reshape(-1), never, 1.0 / temperature, _chunk_rows(weight.shape[0])
    )
    return logp.view(shape), ent.view(shape)


# ---------------------------------------------------------------------- the policy


class LLMPolicy(nn.Module):
    """Hugging Face causal LM + tokenizer as a GRPO policy.

    With ``lora`` set only the adapter is trained and :meth:`reference` returns the
    adapter-disabled base model; otherwise the reference is a frozen copy.
    """

    model: Any  # a transformers PreTrainedModel, or a peft PeftModel around one
    never_ids: Tensor
    stop_ids: Tensor

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
        # transformers/peft attributes are invisible to nn.Module's typing (its __getattr__)
        hf: Any = model
        if lora is not None:
            try:
                from peft import LoraConfig, get_peft_model
            except ImportError as e:  # pragma: no cover - peft is an optional extra
                from grpo_marl.errors import MissingExtraError

                raise MissingExtraError(
                    'model.lora.enabled=true needs peft: pip install -e ".[lora]" (or pip install peft)'
                ) from e
            cfg = LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=lora.target_modules,
                task_type="CAUSAL_LM",
            )
            hf = get_peft_model(hf, cfg)
        if gradient_checkpointing:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if lora is not None and hasattr(hf, "enable_input_require_grads"):
                hf.enable_input_require_grads()
        self.model = hf
        self.gradient_checkpointing = gradient_checkpointing
        self._cache_kw = _cache_kwarg(hf)
        self._decode_cache: dict[tuple[int, ...], str] = {}
        self.fast = FastGPT2(hf) if (fast_path and not gradient_checkpointing and FastGPT2.supports(hf)) else None
        lm = self.causal_lm
        # Scoring splits decoder and LM head (prefix sharing + selective log-softmax) for the
        # architectures where that is exactly the model's forward; others score through it whole.
        self._split = (
            self.fast is None
            and not gradient_checkpointing
            and getattr(lm.config, "model_type", None) in HEAD_SPLIT_MODEL_TYPES
            and getattr(lm.get_output_embeddings(), "bias", None) is None
        )
        self._decoder_cache_kw = _cache_kwarg(lm.get_decoder()) if self._split else "cache"
        # Stop tokens: the tokenizer's EOS plus the generation config's (chat models often end a
        # turn with a different token than the tokenizer's EOS).
        stops = {self.eos_id}
        gen_eos = getattr(getattr(lm, "generation_config", None), "eos_token_id", None)
        for tid in [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []):
            stops.add(int(tid))
        # Tokens a completion must never contain: padding, <unk>, and ids past the tokenizer
        # (padded embedding rows of real checkpoints). Sampling and scoring both mask them, so the
        # behaviour and training distributions stay identical; a tiny model trained from scratch
        # also explores faster without them.
        vocab = int(hf.get_output_embeddings().weight.shape[0])
        stops = {s for s in stops if s < vocab}
        never = torch.zeros(vocab, dtype=torch.bool)
        never[min(len(tokenizer), vocab) :] = True
        for tid in (tokenizer.pad_token_id, getattr(tokenizer, "unk_token_id", None)):
            if tid is not None and tid not in stops and tid < vocab:
                never[tid] = True
        dev = next(hf.parameters()).device
        self.register_buffer("never_ids", never.to(dev), persistent=False)
        self.register_buffer("stop_ids", torch.tensor(sorted(stops), dtype=torch.long, device=dev), persistent=False)

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
        """Load model + tokenizer from an HF directory, a ``.gguf`` file or a hub name (see
        :func:`grpo_marl.text.loading.load_model`). ``dtype="auto"`` is float32 (see
        :func:`resolve_dtype`). Third-party progress bars and warnings (transformers, peft) are kept
        off the terminal meanwhile (:func:`grpo_marl.text.loading.quiet_third_party`)."""
        from grpo_marl.text.loading import load_model, quiet_third_party

        device = torch.device(device)
        model, tok = load_model(
            str(path), dtype=resolve_dtype(dtype, device), device=device, trust_remote_code=trust_remote_code
        )
        with quiet_third_party():  # peft's warnings when it wraps the model (LoRA)
            return cls(model, tok, lora=lora, gradient_checkpointing=gradient_checkpointing)

    def save_pretrained(self, path: str | Path, *, merge_lora: bool = True) -> Path:
        """Write a plain HF model dir (safetensors + tokenizer + chat template) that
        ``from_pretrained``/``model.path=`` reloads. LoRA adapters are merged into a copy of the
        base weights by default; ``merge_lora=False`` writes the adapter alone (peft format).
        transformers' "Writing model shards" bar and warnings are hidden, as when loading."""
        from grpo_marl.text.loading import quiet_third_party

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        with quiet_third_party():
            model = self.model
            if self.lora is not None and merge_lora:
                model = copy.deepcopy(model).merge_and_unload()
            model.save_pretrained(out)
            self.tokenizer.save_pretrained(out)
        return out

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def causal_lm(self) -> Any:
        """The transformers ``*ForCausalLM`` module (inside the peft wrapper with LoRA)."""
        get_base = getattr(self.model, "get_base_model", None)
        return get_base() if callable(get_base) else self.model

    def reference(self) -> LLMPolicy | AdapterDisabledReference:
        """The reference policy for the KL term.

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

    def encode_prompts(self, prompts: Sequence[str], *, add_special_tokens: bool = True) -> tuple[Tensor, Tensor]:
        """Tokenize and left-pad prompts: ``(ids[N, P], mask[N, P])`` on the policy's device.
        Prompts rendered through a chat template already hold their special tokens: pass
        ``add_special_tokens=False`` for them."""
        enc = self.tokenizer(
            list(prompts),
            padding=True,
            return_tensors="pt",
            padding_side="left",
            add_special_tokens=add_special_tokens,
        )
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    def decode(self, completion_ids: Tensor, completion_mask: Tensor) -> list[str]:
        """Completion texts (stop token and padding dropped) for ``[B, T]`` ids and their mask.

        Memoized per distinct token sequence: group members and successive updates repeat
        completions a lot (all of them, once a policy converges), and the tokenizer's Python
        decode is otherwise a visible share of a tiny model's update.
        """
        n = completion_mask.sum(1)
        last = completion_ids.gather(1, (n - 1).clamp_min(0)[:, None]).squeeze(1)
        stopped = (n > 0) & torch.isin(last, self.stop_ids)
        lengths = (n - stopped.long()).tolist()
        rows = completion_ids.tolist()
        keys = [tuple(r[:k]) for r, k in zip(rows, lengths)]
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
        keep_cache: bool = False,
        with_entropy: bool = False,
    ) -> Generation:
        """Sample ``num_samples`` completions per prompt (rows of one prompt are contiguous).

        Prompts are prefilled once and the KV cache is repeated ``num_samples`` times, so a group
        of G completions costs one prompt forward, not G. Sampling stops at a stop token per row
        (later tokens are padding, masked out) and the loop exits as soon as every row stopped.
        ``keep_cache`` keeps the final KV cache in the result (for :meth:`branch`);
        ``with_entropy`` records the entropy of each sampled token's distribution.
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
                model,
                prompt_ids,
                prompt_mask,
                max_new_tokens,
                temperature,
                top_p,
                greedy,
                num_samples,
                generator,
                keep_cache,
                with_entropy,
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
        keep_cache: bool = False,
        with_entropy: bool = False,
    ) -> Generation:
        n, p_len = prompt_ids.shape
        padded = bool((prompt_mask == 0).any())
        pos = positions_from_mask(prompt_mask)
        fast = self.fast if (self.fast is not None and model is self.model) else None
        cache: Any  # FastGPT2's list of (key, value) or a transformers Cache
        if fast is not None:
            logits, cache = fast(prompt_ids, pos, prompt_mask if padded else None, None, logits_to_keep=1)
        else:
            out = model(
                input_ids=prompt_ids,
                attention_mask=prompt_mask if padded else None,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
            )
            cache, logits = _out_cache(out), out.logits
        logits = logits[:, -1]
        if num_samples > 1:
            cache = self._repeat_cache(cache, num_samples, fast)
            logits = logits.repeat_interleave(num_samples, 0)
            prompt_mask = prompt_mask.repeat_interleave(num_samples, 0)
            prompt_ids = prompt_ids.repeat_interleave(num_samples, 0)
            pos = pos.repeat_interleave(num_samples, 0)
        tokens, logps, completion_mask, done, ent, cache = self._decode(
            model,
            fast,
            cache,
            logits,
            prompt_mask,
            pos[:, -1:] + 1,
            max_new_tokens,
            None,
            padded,
            temperature,
            top_p,
            greedy,
            generator,
            with_entropy,
        )
        return Generation(
            input_ids=torch.cat([prompt_ids, tokens], 1),
            attention_mask=torch.cat([prompt_mask.long(), completion_mask], 1),
            completion_mask=completion_mask,
            logp=logps,
            truncated=~done,
            prompt_len=p_len,
            entropy=ent,
            cache=cache if keep_cache else None,
        )

    @staticmethod
    def _repeat_cache(cache: Any, n: int, fast: FastGPT2 | None) -> Any:
        """Each row of a KV cache ``n`` times (rows of one source contiguous)."""
        if fast is not None:
            return fast.repeat_cache(cache, n)
        cache.batch_repeat_interleave(n)
        return cache

    def _decode(
        self,
        model: nn.Module,
        fast: FastGPT2 | None,
        cache: Any,
        logits: Tensor,
        prefix_mask: Tensor,
        next_pos: Tensor,
        max_new_tokens: int,
        budget: Tensor | None,
        padded: bool,
        temperature: float,
        top_p: float,
        greedy: bool,
        generator: torch.Generator | None,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Any]:
        """The sampling loop over a prefilled KV cache: ``logits[B, V]`` predict the first new
        token, ``prefix_mask[B, S]`` marks the attendable entries of the ``S``-entry cache (holes
        allowed: branches of different prefix lengths share one cache block), ``next_pos[B, 1]``
        is the first new token's position. ``budget[B]`` caps each row's new tokens (None: all
        ``max_new_tokens``). Returns tokens, log-probs, completion mask ``[B, steps]``, which rows
        stopped on a stop token, the entropies (``with_entropy``) and the cache."""
        b, s_len = prefix_mask.shape
        dev = logits.device
        tokens = torch.full((b, max_new_tokens), self.pad_id, dtype=torch.long, device=dev)
        logps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=dev)
        ents = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=dev) if with_entropy else None
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        stopped = torch.zeros(b, dtype=torch.bool, device=dev)
        alive_len = torch.zeros(b, dtype=torch.long, device=dev)
        attn = torch.cat([prefix_mask, torch.ones((b, max_new_tokens), dtype=prefix_mask.dtype, device=dev)], 1)
        inv_t = 1.0 if greedy else 1.0 / temperature
        single_stop = self.stop_ids.numel() == 1
        kw: dict[str, Any] = {"use_cache": True, "logits_to_keep": 1}
        steps = 0
        for t in range(max_new_tokens):
            stopping.check()  # a signal abandons an evaluation between generation steps
            scaled = logits.float().mul(inv_t).masked_fill(self.never_ids, NEG_LOGIT)
            logprobs = scaled.log_softmax(-1)
            if greedy:
                tok = scaled.argmax(-1)
            else:
                probs = logprobs.exp() if top_p >= 1.0 else top_p_filter(scaled, top_p).softmax(-1)
                tok = sample_rows(probs, generator)
            if ents is not None:
                ents[:, t] = -(logprobs.exp() * logprobs).sum(-1).masked_fill(done, 0.0)
            tok = tok.masked_fill(done, self.pad_id)
            tokens[:, t] = tok
            logps[:, t] = logprobs.gather(1, tok[:, None]).squeeze(1).masked_fill(done, 0.0)
            alive_len += (~done).long()
            stop = (tok == self.eos_id) if single_stop else torch.isin(tok, self.stop_ids)
            stopped = stopped | (stop & ~done)
            done = done | stop
            if budget is not None:
                done = done | (alive_len >= budget)
            steps = t + 1
            if t + 1 == max_new_tokens or bool(done.all()):
                break
            # Stopped rows feed EOS (their outputs are ignored); feeding the pad id without a
            # mask makes transformers warn about unmasked padding.
            step_ids = tok.masked_fill(done, self.eos_id)[:, None]
            step_mask = attn[:, : s_len + t + 1] if padded else None
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
        return tokens, logps, completion_mask, stopped, None if ents is None else ents[:, :steps], cache

    @torch.no_grad()
    def branch(
        self,
        gen: Generation,
        rows: Tensor,
        starts: Tensor,
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """Continuations from prefixes of sampled completions, reusing their KV cache.

        Prefix ``j`` is the prompt of completion ``rows[j]`` of ``gen`` (a :meth:`generate` with
        ``keep_cache=True``) followed by that completion's first ``starts[j]`` tokens (``1 <=
        starts[j] < its length``); ``num_samples`` continuations are sampled from each (rows of one
        prefix contiguous), each with at most ``max_new_tokens - starts[j]`` new tokens, so a
        continuation with its prefix fits the completion budget. The prefix is never recomputed:
        the cache of ``gen`` is cut to the longest prefix and its rows selected, each prefix feeds
        its last token once (the only prefix work), and the cache is repeated over the branches,
        so a branch pays only its own tokens. All prefixes run in one decode loop; a shorter
        prefix's unused cache entries are masked out (a hole in the attention mask, the positions
        count only real tokens).

        Returns a :class:`Generation` whose completion block holds the *continuation* tokens only,
        in the usual layout: the prompt + prefix block left-padded to ``prompt_len`` (the widest
        prefix), so :meth:`completion_logprobs` scores the continuations as it scores completions.
        The cache of ``gen`` is consumed (cut and reordered in place).
        """
        if gen.cache is None:
            raise ValueError("LLMPolicy.branch needs a generation sampled with keep_cache=True")
        if rows.numel() == 0:
            raise ValueError("LLMPolicy.branch: no prefixes to branch from")
        starts = starts.to(torch.long)
        if bool((starts < 1).any()) or bool((starts >= gen.lengths[rows]).any()):
            raise ValueError("LLMPolicy.branch: every start must lie inside its completion (1 <= t < length)")
        model = self.model
        was_training = model.training
        toggle = was_training and self.fast is None
        if toggle:
            model.eval()
        try:
            return self._branch(model, gen, rows, starts, num_samples, max_new_tokens, temperature, top_p, generator)
        finally:
            if toggle:
                model.train(was_training)

    def _branch(
        self,
        model: nn.Module,
        gen: Generation,
        rows: Tensor,
        starts: Tensor,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        generator: torch.Generator | None,
    ) -> Generation:
        p_len = gen.prompt_len
        dev = rows.device
        t_max = int(starts.max())
        width = p_len + t_max - 1  # cache entries kept: the prompt and completion tokens 0 .. t_max - 2
        fast = self.fast if (self.fast is not None and model is self.model) else None
        cache = gen.cache
        if fast is not None:
            cache = [(k[rows, :, :width], v[rows, :, :width]) for k, v in cache]
        else:
            if not getattr(cache, "is_croppable", True):
                raise ValueError(f"LLMPolicy.branch: the model's {type(cache).__name__} cannot be cut to a prefix")
            extra = int(cache.get_seq_length()) - width
            if extra > 0:
                cache.crop(-extra)  # a negative count removes that many entries (transformers 4.x and 5.x)
            cache.batch_select_indices(rows)
        n = rows.numel()
        ar = torch.arange(t_max, device=dev)
        comp = gen.completion_ids[rows, :t_max]
        in_prefix = ar[None, :] < (starts[:, None] - 1)  # completion tokens already in the kept cache
        prompt_mask = gen.attention_mask[rows, :p_len].long()
        # [prompt | completion tokens 0 .. t-2 | hole up to t_max - 1]: the kept cache's entries
        prefix_mask = torch.cat([prompt_mask, in_prefix[:, : t_max - 1].long()], 1)
        last_tok = comp.gather(1, (starts - 1)[:, None])  # token t-1: fed once, predicts token t
        n_prompt = prompt_mask.sum(1, keepdim=True)
        feed_pos = n_prompt + starts[:, None] - 1
        feed_mask = torch.cat([prefix_mask, torch.ones((n, 1), dtype=prefix_mask.dtype, device=dev)], 1)
        if fast is not None:
            logits, cache = fast(last_tok, feed_pos, feed_mask, cache, logits_to_keep=1)
        else:
            out = model(
                input_ids=last_tok,
                attention_mask=feed_mask,
                position_ids=feed_pos,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kw: cache},
            )
            cache, logits = _out_cache(out), out.logits
        logits = logits[:, -1]
        budget = max_new_tokens - starts
        k = num_samples
        if k > 1:
            cache = self._repeat_cache(cache, k, fast)
            logits = logits.repeat_interleave(k, 0)
            feed_mask = feed_mask.repeat_interleave(k, 0)
            feed_pos = feed_pos.repeat_interleave(k, 0)
            budget = budget.repeat_interleave(k, 0)
        tokens, logps, completion_mask, stopped, _, _ = self._decode(
            model,
            fast,
            cache,
            logits,
            feed_mask,
            feed_pos + 1,
            int(budget.max()),
            budget,
            True,
            temperature,
            top_p,
            False,
            generator,
            False,
        )
        # The prefix block in the Task's layout: prompt + completion tokens 0 .. t-1, left-padded to
        # the widest prefix (so the block's last column predicts the continuation's first token).
        full_ids = torch.cat([gen.input_ids[rows, :p_len], comp], 1)
        full_attn = torch.cat([prompt_mask, torch.ones_like(comp)], 1)
        src = torch.arange(p_len + t_max, device=dev)[None, :] - (t_max - starts)[:, None]
        keep = src >= 0
        prefix_ids = full_ids.gather(1, src.clamp_min(0)).masked_fill(~keep, self.pad_id)
        prefix_attn = full_attn.gather(1, src.clamp_min(0)).masked_fill(~keep, 0)
        if k > 1:
            prefix_ids = prefix_ids.repeat_interleave(k, 0)
            prefix_attn = prefix_attn.repeat_interleave(k, 0)
        return Generation(
            input_ids=torch.cat([prefix_ids, tokens], 1),
            attention_mask=torch.cat([prefix_attn, completion_mask], 1),
            completion_mask=completion_mask,
            logp=logps,
            truncated=~stopped,
            prompt_len=p_len + t_max,
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
        """Log-probs (and entropies) of the completion tokens.

        ``input_ids``/``attention_mask`` are ``[B, P+T]``, ``completion_mask`` is ``[B, T]``.
        Returns ``logp[B, T]`` (0 where masked) and ``entropy[B, T]`` or None. ``model``
        overrides the scoring model (a reference); default is the trained model.
        """
        model = self.model if model is None else model
        t_len = completion_mask.shape[1]
        targets = input_ids[:, -t_len:]
        if self._split and model is self.model:
            hidden = self._completion_hidden(input_ids, attention_mask, t_len)
            head = self.causal_lm.get_output_embeddings().weight
            logp, ent = selective_logprobs(hidden, head, targets, self.never_ids, temperature)
            mask = completion_mask.to(logp.dtype)
            return logp * mask, (ent * mask if with_entropy else None)
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
        logz = logits.logsumexp(-1)
        logp = logits.gather(-1, targets[..., None]).squeeze(-1) - logz
        mask = completion_mask.to(logp.dtype)
        logp = logp * mask
        entropy = None
        if with_entropy:
            probs = (logits - logz[..., None]).exp()
            entropy = (logz - (probs * logits).sum(-1)) * mask
        return logp, entropy

    def _decoder(self, input_ids: Tensor, mask: Tensor | None, pos: Tensor, cache: Any, use_cache: bool) -> Any:
        return self.causal_lm.get_decoder()(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=use_cache,
            **{self._decoder_cache_kw: cache},
        )

    def _completion_hidden(self, input_ids: Tensor, attention_mask: Tensor, t_len: int) -> Tensor:
        """``[B, T, d]`` final hidden states at the positions predicting the completion tokens.

        Rows with the same prompt block share one prompt forward: the distinct prompts are run
        with a KV cache, which is indexed out to every row for the completion forward.
        """
        b, width = input_ids.shape
        p_len = width - t_len
        prompt_ids = input_ids[:, :p_len]
        # Padding is part of the row (masked ids are the pad id), so equal ids mean equal prompts.
        uniq, inverse = torch.unique(prompt_ids, dim=0, return_inverse=True)
        padded = bool((attention_mask == 0).any())
        pos = positions_from_mask(attention_mask)
        if p_len == 0 or uniq.shape[0] == b:
            hid = self._decoder(input_ids, attention_mask if padded else None, pos, None, False).last_hidden_state
            return hid[:, p_len - 1 : width - 1]
        first = torch.zeros(uniq.shape[0], dtype=torch.long, device=inverse.device)
        first.scatter_(0, inverse.flip(0), torch.arange(b - 1, -1, -1, device=inverse.device))
        p_mask = attention_mask[first, :p_len]
        out = self._decoder(uniq, p_mask if padded else None, pos[first, :p_len], None, True)
        cache = _out_cache(out)
        cache.batch_select_indices(inverse)
        last_prompt = out.last_hidden_state[:, -1:][inverse]
        if t_len == 1:
            return last_prompt
        comp = self._decoder(
            input_ids[:, p_len:-1], attention_mask[:, :-1] if padded else None, pos[:, p_len:-1], cache, False
        ).last_hidden_state
        return torch.cat([last_prompt, comp], 1)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, completion_mask: Tensor, temperature: float = 1.0
    ) -> tuple[Tensor, Tensor | None]:
        """Alias of :meth:`completion_logprobs` with entropy (so the policy is a normal module)."""
        return self.completion_logprobs(
            input_ids, attention_mask, completion_mask, temperature=temperature, with_entropy=True
        )


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
    """``auto``: float32 on every device (master weights for training; on CUDA ``autocast=auto``
    runs the matmuls in bf16, see :func:`grpo_marl.trainer.autocast_dtype` for why the weights
    stay float32); otherwise a torch dtype or its name."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.float32
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        from grpo_marl.errors import ConfigError

        raise ConfigError(f"model.dtype={dtype!r} is not a dtype; use auto, float32, bfloat16 or float16")
    return value
