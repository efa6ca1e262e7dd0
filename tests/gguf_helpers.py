"""A tiny Llama chat model written to a ``.gguf`` file: the real-model path without the big file.

Plain Python (transformers, torch and the ``gguf`` package, all in the ``text`` extra; no pytest),
so the tests and the CI check of the ``text`` extra (``.ci/text_extra_check.py``) write the same
file. The model is built from a config (random weights) with a byte-level BPE tokenizer of 260
tokens and a ChatML-style chat template, and round-trips through transformers' GGUF reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_vocab() -> tuple[list[str], list[str]]:
    """Tokens (3 specials, the 256 byte-level symbols, one merged token) and their merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    return [*SPECIALS, *symbols, "ĠĠ"], ["Ġ Ġ"]


def tiny_llama(vocab: int, seed: int = 0, max_positions: int = 128) -> Any:
    """A 2-layer, 32-wide Llama with random weights (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (transformers undoes it when reading)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model: Any, path: Path) -> Path:
    """Write a Llama model (float32) and a byte-level BPE tokenizer with a chat template to GGUF."""
    import gguf

    cfg = model.config
    tokens, merges = byte_level_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.detach().float().numpy().copy()
        if name.endswith("q_proj.weight"):
            data = _permute(data, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            data = _permute(data, cfg.num_key_value_heads)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight",)), data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_gguf(path: Path, seed: int = 0, max_positions: int = 128) -> Path:
    """:func:`tiny_llama` over :func:`byte_level_vocab`, written to ``path`` (a ``.gguf`` file)."""
    return write_llama_gguf(tiny_llama(len(byte_level_vocab()[0]), seed, max_positions), Path(path))
