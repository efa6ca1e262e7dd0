"""Real-model path without the big file: a tiny Llama written to ``.gguf`` (with the ``gguf`` package),
loaded through ``model.path``, trained, saved as a plain HF dir and reloaded; chat-template prompts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parents[1]
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


def tiny_llama(vocab: int, seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
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


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    model = tiny_llama(len(byte_level_vocab()[0]))
    return write_llama_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"), model


def test_gguf_loads_as_plain_trainable_model(gguf_model: tuple[Path, Any], tmp_path: Path) -> None:
    from grpo_marl.text.loading import load_model

    path, original = gguf_model
    model, tok = load_model(str(path))
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    assert "quantization_config" not in model.config.to_dict()
    for name, tensor in original.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, msg=name)  # q/k un-permuted
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == "<|im_end|>"
    model.save_pretrained(tmp_path / "plain")  # refused while marked as GGUF-quantized


def test_chat_prompts_render_and_completions_start_after_generation_prompt(gguf_model: tuple[Path, Any]) -> None:
    from grpo_marl.policies.llm import LLMPolicy
    from grpo_marl.text.chat import render_prompts

    policy = LLMPolicy.from_pretrained(gguf_model[0])
    messages = [[{"role": "user", "content": "Compute 1 + 2."}], [{"role": "user", "content": "Compute 10 + 20."}]]
    texts, templated = render_prompts(policy.tokenizer, messages, "auto", system_prompt="Be brief.")
    assert templated
    assert texts[0] == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCompute 1 + 2.<|im_end|>\n<|im_start|>assistant\n"
    )
    # auto leaves plain strings alone; true wraps them as a user message; false never renders.
    assert render_prompts(policy.tokenizer, ["1+2="], "auto") == (["1+2="], False)
    assert render_prompts(policy.tokenizer, ["1+2="], True)[0][0].startswith("<|im_start|>user\n1+2=")
    assert not render_prompts(policy.tokenizer, messages, False)[1]
    ids, mask = policy.encode_prompts(texts, add_special_tokens=False)
    gen = policy.generate(ids, mask, max_new_tokens=5, num_samples=2, generator=torch.Generator().manual_seed(0))
    gen_prompt = policy.tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    for row in range(gen.input_ids.shape[0]):
        prompt = gen.input_ids[row, : gen.prompt_len][gen.attention_mask[row, : gen.prompt_len].bool()].tolist()
        assert prompt[-len(gen_prompt) :] == gen_prompt  # the prompt block ends with the generation prompt
        assert policy.tokenizer.decode(prompt) == texts[row // 2]
    # The completion mask covers exactly the tokens after it: scoring them alone (teacher forced,
    # token by token) gives the sampler's log-probs.
    logp, _ = policy.completion_logprobs(gen.input_ids, gen.attention_mask, gen.completion_mask)
    torch.testing.assert_close(logp, gen.logp, atol=1e-5, rtol=1e-5)


def test_split_scoring_gradients_match_full_forward(gguf_model: tuple[Path, Any]) -> None:
    """Prefix-shared prompts + chunked selective log-softmax give the plain forward's values and gradients."""
    from grpo_marl.policies.llm import LLMPolicy

    policy = LLMPolicy.from_pretrained(gguf_model[0])
    assert policy._split
    texts = ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>user\nhello there<|im_end|>\n"]
    ids, mask = policy.encode_prompts(texts, add_special_tokens=False)
    gen = policy.generate(ids, mask, max_new_tokens=6, num_samples=3, generator=torch.Generator().manual_seed(1))
    weights = torch.rand(gen.completion_mask.shape)

    def grads(split: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        policy._split = split
        policy.zero_grad(set_to_none=True)
        logp, ent = policy.completion_logprobs(
            gen.input_ids, gen.attention_mask, gen.completion_mask, temperature=0.7, with_entropy=True
        )
        assert ent is not None
        ((logp * weights).sum() + 0.3 * ent.sum()).backward()
        return logp.detach(), ent.detach(), [p.grad.clone() for p in policy.parameters()]

    lp_s, ent_s, g_s = grads(True)
    lp_f, ent_f, g_f = grads(False)
    policy._split = True
    torch.testing.assert_close(lp_s, lp_f, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ent_s, ent_f, atol=1e-5, rtol=1e-4)
    for a, b in zip(g_s, g_f):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-3)


def _jsonl(path: Path, n: int, offset: int = 0) -> Path:
    rows = [
        {"prompt": [{"role": "user", "content": f"Compute {a} + {a + 1}."}], "answer": str(2 * a + 1)}
        for a in range(offset, offset + n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gguf_trains_saves_and_reloads_through_model_path(
    gguf_model: tuple[Path, Any], train: Callable[..., dict], tmp_path: Path
) -> None:
    data = _jsonl(tmp_path / "train.jsonl", 12)
    held = _jsonl(tmp_path / "eval.jsonl", 4, offset=20)
    run_dir = tmp_path / "run"
    common = [
        "env=text_jsonl",
        f"+env_kwargs.path={data}",
        f"+env_kwargs.eval_path={held}",
        "+env_kwargs.accuracy=last_int_match",
        "+env_kwargs.max_new_tokens=4",
        "algo.num_groups=2",
        "algo.group_size=4",
        "algo.beta=0.04",
        # the random tiny model rarely gets a sum right, so most groups carry no advantage: the
        # entropy bonus gives every update a gradient, whatever the sampled completions
        "algo.entropy_coef=0.01",
        "log.tensorboard=false",
        "text.log_completions_every=1",
        "threads=1",
    ]
    summary = train(run_dir, *common, f"model.path={gguf_model[0]}", "total_steps=24", "algo.lr=1e-2")
    assert summary["env_steps"] == 24 and summary["text/chat_template"] is True
    model_dir = Path(summary["model_dir"])
    from safetensors.torch import load_file

    saved = load_file(str(model_dir / "model.safetensors"))
    trained = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    policy_state = trained["modules"]["policy"] if "modules" in trained else trained["policy"]
    changed = 0
    for name, value in saved.items():
        torch.testing.assert_close(value, policy_state[f"model.{name}"], msg=name)
        changed += not torch.equal(value, gguf_model[1].state_dict()[name])
    assert changed > 0  # training moved the weights away from the .gguf ones
    assert (model_dir / "tokenizer.json").exists()
    assert "<|im_start|>" in (model_dir / "chat_template.jinja").read_text()
    assert "quantization_config" not in json.loads((model_dir / "config.json").read_text())
    # Logged prompts are the rendered ones (template and generation prompt included).
    logged = [json.loads(x) for x in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert logged and logged[0]["prompt"].endswith("<|im_start|>assistant\n")
    # The saved dir reloads with model.path= (same greedy evaluation without further learning).
    again = train(tmp_path / "again", *common, f"model.path={model_dir}", "total_steps=8", "algo.lr=1e-12")
    assert again["eval/accuracy"] == summary["eval/accuracy"]
    assert again["eval/return_mean"] == pytest.approx(summary["eval/return_mean"])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", "grpo_marl.train", *args, "log.progress=false"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_bad_model_path_and_missing_jsonl_path_are_one_clear_line(tmp_path: Path) -> None:
    proc = _cli("env=arithmetic", "model.path=/nonexistent/model", f"hydra.run.dir={tmp_path / 'a'}", cwd=ROOT)
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if "model.path" in x]
    assert lines and "/nonexistent/model: no such file or directory" in lines[0]
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) <= 4
    proc = _cli("env=text_jsonl", f"hydra.run.dir={tmp_path / 'b'}", cwd=ROOT)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "+env_kwargs.path=data.jsonl" in proc.stderr


def test_pkg_model_paths_resolve_inside_installed_packages(tmp_path: Path) -> None:
    from envs.text import resolve_package_path
    from grpo_marl.errors import ModelPathError

    assert resolve_package_path("pkg://envs/text/tasks.py") == str(ROOT / "envs" / "text" / "tasks.py")
    assert resolve_package_path(str(tmp_path)) == str(tmp_path)  # other paths unchanged
    with pytest.raises(ModelPathError, match=r"package 'no_such_pkg_for_test' is not installed"):
        resolve_package_path("pkg://no_such_pkg_for_test/model.gguf")
    with pytest.raises(ModelPathError, match=r"does not exist in the installed package"):
        resolve_package_path("pkg://envs/missing.gguf")
