"""Tiny causal language models and character-level tokenizers, built locally.

Why this exists: the text environments must train end to end on a CPU with no network, so the
model and tokenizer cannot come from the Hugging Face hub. We build a character-level tokenizer
over a task's alphabet (a small vocabulary makes exploration from a random init feasible) and a
GPT-2 or Qwen2 architecture model from a config, and save both as an ordinary Hugging Face model
directory. Anything downstream (``LLMPolicy.from_pretrained``, ``model.path=...`` on the CLI,
TRL) then treats it exactly like a hub checkpoint: the code path for a tiny model and a real one
is the same.

Nothing here downloads anything.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)

#: A generic alphabet for tasks that do not declare their own (printable ASCII minus control).
DEFAULT_ALPHABET: str = string.digits + string.ascii_letters + string.punctuation + " "


def build_char_tokenizer(alphabet: str, *, model_max_length: int = 128) -> Any:
    """Return a ``PreTrainedTokenizerFast`` with one token per character of ``alphabet``.

    Ids: 0 = ``<pad>``, 1 = ``<eos>`` (also used as BOS), 2 = ``<unk>``, then the characters in
    the order given (duplicates dropped). Decoding concatenates characters (no spaces inserted),
    so ``decode(encode(s)) == s`` for any string over the alphabet.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        if ch not in vocab:
            vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    # Every character is its own pre-token (spaces included), so WordLevel maps chars to ids.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        padding_side="left",
    )
    return tok


@dataclass
class TinyLMConfig:
    """Architecture of a tiny causal LM (defaults train single-digit addition in minutes on CPU)."""

    arch: str = "gpt2"
    """``gpt2`` (learned positions, LayerNorm) or ``qwen2`` (RoPE, RMSNorm, SwiGLU)."""
    hidden_size: int = 64
    """Model width."""
    num_layers: int = 2
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads (hidden_size must be divisible by it)."""
    intermediate_size: int = 256
    """MLP hidden width."""
    max_positions: int = 64
    """Longest prompt + completion the model can see."""
    alphabet: str = DEFAULT_ALPHABET
    """Characters of the tokenizer (one token each, plus <pad>, <eos>, <unk>)."""
    tie_embeddings: bool = True
    """Share input embedding and output head (fewer parameters, faster learning)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to the transformers config class."""


def build_tiny_lm(cfg: TinyLMConfig, *, seed: int = 0) -> tuple[Any, Any]:
    """Build a randomly initialised tiny causal LM and its char tokenizer: ``(model, tokenizer)``."""
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        PretrainedConfig,
        PreTrainedModel,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    if cfg.hidden_size % cfg.num_heads != 0:
        raise ValueError(f"tiny_lm: hidden_size={cfg.hidden_size} must be divisible by num_heads={cfg.num_heads}")
    tok = build_char_tokenizer(cfg.alphabet, model_max_length=cfg.max_positions)
    common = {
        "vocab_size": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "tie_word_embeddings": cfg.tie_embeddings,
    }
    # Seed locally so building a model never perturbs the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config: PretrainedConfig
        model: PreTrainedModel
        if cfg.arch == "gpt2":
            config = GPT2Config(
                n_positions=cfg.max_positions,
                n_embd=cfg.hidden_size,
                n_layer=cfg.num_layers,
                n_head=cfg.num_heads,
                n_inner=cfg.intermediate_size,
                # One fused op instead of GPT-2's tanh-approximation chain (mul/pow/add/tanh):
                # for a tiny model the elementwise op count, not FLOPs, sets the step time.
                **{
                    "activation_function": "gelu",
                    "resid_pdrop": 0.0,
                    "embd_pdrop": 0.0,
                    "attn_pdrop": 0.0,
                    **common,
                    **cfg.extra,
                },
            )
            model = GPT2LMHeadModel(config)
        elif cfg.arch == "qwen2":
            config = Qwen2Config(
                hidden_size=cfg.hidden_size,
                intermediate_size=cfg.intermediate_size,
                num_hidden_layers=cfg.num_layers,
                num_attention_heads=cfg.num_heads,
                num_key_value_heads=cfg.num_heads,
                max_position_embeddings=cfg.max_positions,
                **{**common, **cfg.extra},
            )
            model = Qwen2ForCausalLM(config)
        else:
            raise ValueError(f"tiny_lm: unknown arch {cfg.arch!r}; use 'gpt2' or 'qwen2'")
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model, tok


def save_tiny_lm(model: Any, tokenizer: Any, path: str | Path, cfg: TinyLMConfig | None = None) -> Path:
    """Save model + tokenizer as a Hugging Face model dir (reloadable with ``from_pretrained``)."""
    import json

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if cfg is not None:
        (out / "tiny_lm.json").write_text(json.dumps(asdict(cfg), indent=2))
    return out


def make_tiny_lm(path: str | Path, cfg: TinyLMConfig | None = None, *, seed: int = 0) -> Path:
    """Build a tiny LM from ``cfg`` and save it to ``path``; return the path."""
    cfg = cfg or TinyLMConfig()
    model, tok = build_tiny_lm(cfg, seed=seed)
    return save_tiny_lm(model, tok, path, cfg)


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m grpo_marl.tiny_lm OUT_DIR [--arch gpt2] [--alphabet '0123456789+=']``."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("out")
    defaults = TinyLMConfig()
    for name, val in asdict(defaults).items():
        if isinstance(val, (int, str)) and not isinstance(val, bool):
            p.add_argument(f"--{name.replace('_', '-')}", type=type(val), default=val)
    p.add_argument("--seed", type=int, default=0)
    args = vars(p.parse_args(argv))
    out, seed = args.pop("out"), args.pop("seed")
    path = make_tiny_lm(out, TinyLMConfig(**args), seed=seed)
    print(path)


if __name__ == "__main__":
    main()
