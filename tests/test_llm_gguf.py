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

import pytest
import torch

from tests.conftest import needs, require
from tests.gguf_helpers import CHAT_TEMPLATE, byte_level_vocab, tiny_llama, write_llama_gguf

#: a tiny Llama written to .gguf and loaded through transformers: the text extra
GGUF = ("gguf", "transformers", "tokenizers", "accelerate")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    require(*GGUF, extra="text")
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


@needs("transformers", "tokenizers", extra="text")
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
