"""LLM policy: one-pass completion log-probs, masking, KL, LoRA reference, save/load (tiny local model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_marl.policies.llm import LLMPolicy, LoraSpec, kl_k3, positions_from_mask, sample_rows, top_p_filter
from grpo_marl.tiny_lm import TinyLMConfig, build_char_tokenizer, build_tiny_lm, make_tiny_lm
from tests.conftest import needs, require

#: the tiny models and their tokenizer are transformers / tokenizers objects (the text extra)
TEXT = ("transformers", "tokenizers")

ALPHABET = "0123456789+="
PROMPTS = ["1+2=", "33+4=", "5+55="]  # different lengths -> left padding


@pytest.fixture(scope="module", params=["gpt2", "qwen2"])
def policy(request: pytest.FixtureRequest) -> LLMPolicy:
    require(*TEXT, extra="text")
    model, tok = build_tiny_lm(TinyLMConfig(arch=request.param, hidden_size=32, num_heads=2, alphabet=ALPHABET))
    return LLMPolicy(model, tok)


def _sample(policy: LLMPolicy, n: int = 3, max_new_tokens: int = 6, seed: int = 0):  # type: ignore[no-untyped-def]
    ids, mask = policy.encode_prompts(PROMPTS)
    gen = torch.Generator().manual_seed(seed)
    return policy.generate(ids, mask, max_new_tokens=max_new_tokens, num_samples=n, generator=gen), ids, mask


def _token_by_token_logp(policy: LLMPolicy, g, prompt_mask: torch.Tensor, n: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Reference: unpadded sequences, one full forward per prefix (no cache, no batching)."""
    out = torch.zeros_like(g.logp)
    for i in range(g.input_ids.shape[0]):
        p_real = int(prompt_mask[i // n].sum())
        prompt = g.input_ids[i, g.prompt_len - p_real : g.prompt_len]
        for t in range(int(g.completion_mask[i].sum())):
            prefix = torch.cat([prompt, g.completion_ids[i, :t]])
            with torch.no_grad():
                logits = policy.model(prefix[None]).logits[0, -1]
            logits = logits.masked_fill(policy.never_ids, float("-inf"))  # pad/unk are never sampled
            out[i, t] = logits.log_softmax(-1)[g.completion_ids[i, t]]
    return out


def test_completion_logprobs_match_token_by_token(policy: LLMPolicy) -> None:
    g, _, mask = _sample(policy)
    logp, ent = policy.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask, with_entropy=True)
    ref = _token_by_token_logp(policy, g, mask, 3)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=1e-5)
    # The behaviour log-probs recorded while sampling (KV cache) agree with the one-pass score.
    torch.testing.assert_close(g.logp, logp.detach(), atol=1e-5, rtol=1e-5)
    assert ent is not None and (ent >= 0).all() and (ent[g.completion_mask == 0] == 0).all()


def test_masking_prompt_padding_post_eos(policy: LLMPolicy) -> None:
    g, ids, mask = _sample(policy, max_new_tokens=8)
    cm = g.completion_mask
    assert not (g.completion_ids[cm.bool()] == policy.pad_id).any()  # pad is never sampled
    assert g.input_ids.shape[1] == ids.shape[1] + cm.shape[1]
    # Prompt block is the left-padded prompts, repeated per sample; its mask is the prompt mask.
    torch.testing.assert_close(g.input_ids[:, : g.prompt_len], ids.repeat_interleave(3, 0))
    torch.testing.assert_close(g.attention_mask[:, : g.prompt_len], mask.repeat_interleave(3, 0))
    comp = g.completion_ids
    for i in range(cm.shape[0]):
        eos = (comp[i] == policy.eos_id).nonzero()
        n = int(eos[0]) + 1 if len(eos) else cm.shape[1]
        assert cm[i, :n].all() and not cm[i, n:].any()  # EOS included, everything after masked
        assert (comp[i, n:] == policy.pad_id).all()
        assert bool(g.truncated[i]) == (len(eos) == 0)
    # Changing tokens under the mask (post-EOS padding) does not change any log-prob.
    corrupted = g.input_ids.clone()
    tail = torch.zeros_like(corrupted, dtype=torch.bool)
    tail[:, g.prompt_len :] = cm == 0
    corrupted[tail] = 5
    a, _ = policy.completion_logprobs(g.input_ids, g.attention_mask, cm)
    b, _ = policy.completion_logprobs(corrupted, g.attention_mask, cm)
    torch.testing.assert_close(a, b)
    assert (a[cm == 0] == 0).all()
    # Left padding does not change the log-probs of a prompt (positions come from the mask).
    single_ids, single_mask = policy.encode_prompts(PROMPTS[:1])
    solo = policy.generate(single_ids, single_mask, max_new_tokens=4, greedy=True)
    batch = policy.generate(ids, mask, max_new_tokens=4, greedy=True)
    t = solo.completion_mask.shape[1]
    torch.testing.assert_close(solo.completion_ids[0], batch.completion_ids[0, :t])
    torch.testing.assert_close(solo.logp[0], batch.logp[0, :t], atol=1e-5, rtol=1e-5)


def test_kl_zero_for_identical_models(policy: LLMPolicy) -> None:
    g, _, _ = _sample(policy)
    logp, _ = policy.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    reference = policy.reference()
    ref, _ = reference.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    kl = kl_k3(logp, ref, g.completion_mask)
    assert torch.equal(kl, torch.zeros_like(kl))
    # After an update the KL becomes positive and the reference does not move.
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    (-logp.sum()).backward()
    opt.step()
    opt.zero_grad()
    logp2, _ = policy.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    ref2, _ = reference.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    torch.testing.assert_close(ref2, ref)
    assert kl_k3(logp2, ref2, g.completion_mask).sum() > 0
    assert not any(p.requires_grad for p in reference.parameters())
    assert not any(p is q for p in policy.parameters() for q in reference.parameters())


def test_temperature_and_greedy(policy: LLMPolicy) -> None:
    ids, mask = policy.encode_prompts(PROMPTS)
    a = policy.generate(ids, mask, max_new_tokens=5, greedy=True)
    b = policy.generate(ids, mask, max_new_tokens=5, greedy=True)
    assert torch.equal(a.input_ids, b.input_ids)
    g = policy.generate(ids, mask, max_new_tokens=5, temperature=0.7, generator=torch.Generator().manual_seed(1))
    logp, _ = policy.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask, temperature=0.7)
    torch.testing.assert_close(g.logp, logp.detach(), atol=1e-5, rtol=1e-5)


def test_top_p_filter_keeps_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    out = top_p_filter(logits, 0.7)
    assert torch.isfinite(out[0, :2]).all() and torch.isinf(out[0, 2:]).all()
    assert torch.isfinite(top_p_filter(logits, 0.1)[0, 0])  # top-1 always kept
    assert positions_from_mask(torch.tensor([[0, 0, 1, 1]])).tolist() == [[0, 0, 0, 1]]


def test_sample_rows_follows_the_probabilities() -> None:
    """Inverse-CDF sampling: frequencies match each row's (unnormalised) probabilities, zero
    entries (masked tokens, first and last included) are never drawn, a generator replays."""
    probs = torch.tensor([[0.0, 0.1, 0.2, 0.0, 0.7, 0.0], [3.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    n = 100_000
    rows = probs.repeat_interleave(n, 0)
    tok = sample_rows(rows, torch.Generator().manual_seed(0)).view(2, n)
    freq = torch.stack([torch.bincount(t, minlength=6).double() / n for t in tok])
    expected = (probs / probs.sum(-1, keepdim=True)).double()
    assert (freq[expected == 0] == 0).all()
    torch.testing.assert_close(freq, expected, atol=0.006, rtol=0)  # ~4 standard errors
    again = sample_rows(rows, torch.Generator().manual_seed(0)).view(2, n)
    assert torch.equal(tok, again)
    one_hot = torch.zeros(3, 49_152)
    one_hot[torch.arange(3), torch.tensor([0, 777, 49_151])] = 1.0
    assert sample_rows(one_hot).tolist() == [0, 777, 49_151]


@needs(*TEXT, extra="text")
def test_tokenizer_roundtrip() -> None:
    tok = build_char_tokenizer("x^2+ -=0123456789,Solve")
    s = "Solve x^2 + 4x + 3 = 0"
    assert tok.decode(tok(s)["input_ids"]) == s
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1


@needs(*TEXT, extra="text")
def test_save_load_local_dir(tmp_path: Path) -> None:
    path = make_tiny_lm(tmp_path / "tiny", TinyLMConfig(hidden_size=32, num_heads=2, alphabet=ALPHABET), seed=3)
    assert (path / "config.json").exists() and (path / "tiny_lm.json").exists()
    pol = LLMPolicy.from_pretrained(path)
    g, _, _ = _sample(pol)
    before, _ = pol.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    out = pol.save_pretrained(tmp_path / "saved")
    again = LLMPolicy.from_pretrained(out)
    after, _ = again.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    torch.testing.assert_close(before, after)
    assert again.tokenizer.decode(again.tokenizer("12+3=")["input_ids"]) == "12+3="


@needs(*TEXT, "peft", extra="lora")
def test_lora_reference_is_disabled_adapter(tmp_path: Path) -> None:
    model, tok = build_tiny_lm(TinyLMConfig(hidden_size=32, num_heads=2, alphabet=ALPHABET))
    pol = LLMPolicy(model, tok, lora=LoraSpec(r=4, alpha=8), gradient_checkpointing=True)
    trainable = [n for n, p in pol.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)
    g, _, _ = _sample(pol)
    pol.train()
    logp, _ = pol.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    reference = pol.reference()
    assert not list(reference.parameters())  # a view of the base model, not a copy
    ref, _ = reference.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    torch.testing.assert_close(logp.detach(), ref)  # LoRA B starts at zero
    opt = torch.optim.Adam([p for p in pol.parameters() if p.requires_grad], lr=0.05)
    (-logp.sum()).backward()
    opt.step()
    logp2, _ = pol.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    ref2, _ = reference.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    torch.testing.assert_close(ref2, ref)
    assert not torch.allclose(logp2, ref2)
    with pytest.raises(ValueError, match="ref_refresh"):
        reference.load_state_dict(pol.state_dict())
    merged = LLMPolicy.from_pretrained(pol.save_pretrained(tmp_path / "merged"))
    logp3, _ = merged.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask)
    torch.testing.assert_close(logp3, logp2.detach(), atol=1e-5, rtol=1e-5)


@needs(*TEXT, extra="text")
@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_fast_gpt2_path_matches_transformers(act: str) -> None:
    """The lean GPT-2 forward gives the HF logits: prefill with left padding, then cached decode."""
    from grpo_marl.policies.fast_gpt2 import FastGPT2

    model, tok = build_tiny_lm(
        TinyLMConfig(hidden_size=32, num_heads=2, alphabet=ALPHABET, extra={"activation_function": act})
    )
    model.eval()
    fast = FastGPT2(model)
    assert FastGPT2.supports(model)
    pol = LLMPolicy(model, tok)
    ids, mask = pol.encode_prompts(PROMPTS)
    pos = positions_from_mask(mask)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got, cache = fast(ids, pos, mask, None)
        valid = mask.bool()
        torch.testing.assert_close(got[valid], ref[valid], atol=1e-5, rtol=1e-5)
        # Decode two more tokens through the cache == a full forward over the longer sequence.
        nxt = torch.tensor([[5], [6], [7]])
        full_ids = torch.cat([ids, nxt, nxt], 1)
        full_mask = torch.cat([mask, torch.ones(3, 2, dtype=mask.dtype)], 1)
        full_pos = positions_from_mask(full_mask)
        ref2 = model(input_ids=full_ids, attention_mask=full_mask, position_ids=full_pos).logits
        step1, cache = fast(nxt, full_pos[:, -2:-1], full_mask[:, :-1], cache, logits_to_keep=1)
        step2, _ = fast(nxt, full_pos[:, -1:], full_mask, cache, logits_to_keep=1)
        torch.testing.assert_close(step1[:, -1], ref2[:, -2], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(step2[:, -1], ref2[:, -1], atol=1e-5, rtol=1e-5)
    # Same samples and log-probs with and without the fast path.
    slow = LLMPolicy(model, tok, fast_path=False)
    assert slow.fast is None and pol.fast is not None
    gen = torch.Generator().manual_seed(0)
    a = pol.generate(ids, mask, max_new_tokens=5, num_samples=2, generator=gen)
    gen = torch.Generator().manual_seed(0)
    b = slow.generate(ids, mask, max_new_tokens=5, num_samples=2, generator=gen)
    assert torch.equal(a.input_ids, b.input_ids)
    torch.testing.assert_close(a.logp, b.logp, atol=1e-5, rtol=1e-5)
    la, _ = pol.completion_logprobs(a.input_ids, a.attention_mask, a.completion_mask)
    lb, _ = slow.completion_logprobs(a.input_ids, a.attention_mask, a.completion_mask)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)


def test_auto_dtype_keeps_float32_master_weights_on_every_device() -> None:
    """bf16 weights round fine-tuning Adam steps away, so ``auto`` never picks them."""
    from grpo_marl.policies.llm import resolve_dtype

    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) is torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16


def test_autocast_auto_is_bf16_only_for_llms_on_cuda() -> None:
    from grpo_marl.trainer import autocast_dtype

    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu, "text") is None
    assert autocast_dtype("none", cpu, "text") is None
    assert autocast_dtype("bf16", cpu, "gym") is torch.bfloat16
    assert autocast_dtype("auto", torch.device("cuda"), "gym") is None
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        assert autocast_dtype("auto", torch.device("cuda"), "text") is torch.bfloat16


def test_branch_reproduces_the_prefix_and_reuses_its_cache(policy: LLMPolicy) -> None:
    """State groups for text: continuations from prefixes of sampled completions. Each branch's
    prefix is exactly the prompt and the completion's first t tokens, the continuation only adds
    tokens after it (within the budget left), and the log-probs sampled over the reused KV cache
    equal those of a full forward of prompt + prefix + continuation."""
    budget = 8
    ids, mask = policy.encode_prompts(PROMPTS)
    gen = policy.generate(
        ids, mask, max_new_tokens=budget, num_samples=2, generator=torch.Generator().manual_seed(1), keep_cache=True
    )
    lengths = gen.lengths
    rows = (lengths >= 2).nonzero().squeeze(1)
    assert rows.numel() >= 2
    starts = 1 + torch.arange(rows.numel()) % (lengths[rows] - 1)  # prefixes of several lengths
    k = 3
    br = policy.branch(
        gen, rows, starts, num_samples=k, max_new_tokens=budget, generator=torch.Generator().manual_seed(2)
    )
    assert br.input_ids.shape[0] == rows.numel() * k
    assert gen.cache is not None  # (consumed: cut and reordered in place)
    for j in range(br.input_ids.shape[0]):
        r, t = int(rows[j // k]), int(starts[j // k])
        prompt = gen.input_ids[r, : gen.prompt_len][gen.attention_mask[r, : gen.prompt_len].bool()]
        prefix = br.input_ids[j, : br.prompt_len][br.attention_mask[j, : br.prompt_len].bool()]
        assert torch.equal(prefix, torch.cat([prompt, gen.completion_ids[r, :t]]))
        n = int(br.completion_mask[j].sum())
        assert 1 <= n <= budget - t
        cont = br.completion_ids[j, :n]
        with torch.no_grad():  # the reference: one full forward, no cache, no padding
            logits = policy.model(torch.cat([prefix, cont])[None]).logits[0].float()
        logp = logits.masked_fill(policy.never_ids, float("-inf")).log_softmax(-1)
        ref = logp[prefix.numel() - 1 : prefix.numel() - 1 + n].gather(1, cont[:, None]).squeeze(1)
        torch.testing.assert_close(br.logp[j, :n], ref, atol=1e-5, rtol=1e-5)
    # the layout is the Task's: one-pass scoring of the branch rows agrees as well
    scored, _ = policy.completion_logprobs(br.input_ids, br.attention_mask, br.completion_mask)
    torch.testing.assert_close(scored, br.logp, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="inside its completion"):
        policy.branch(gen, rows[:1], lengths[rows[:1]], num_samples=1, max_new_tokens=budget)


def test_generate_records_entropies(policy: LLMPolicy) -> None:
    ids, mask = policy.encode_prompts(PROMPTS)
    g = policy.generate(ids, mask, max_new_tokens=5, generator=torch.Generator().manual_seed(0), with_entropy=True)
    logp, ent = policy.completion_logprobs(g.input_ids, g.attention_mask, g.completion_mask, with_entropy=True)
    assert g.entropy is not None and ent is not None
    torch.testing.assert_close(g.entropy, ent, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_branch_through_a_lora_adapter(arch: str) -> None:
    """With LoRA (peft wraps the model, generation takes the transformers forward and its Cache
    object) the branches' sampled log-probs still equal one-pass scoring of the branch rows."""
    require(*TEXT, "peft", extra="lora")
    model, tok = build_tiny_lm(TinyLMConfig(arch=arch, hidden_size=32, num_heads=2, alphabet=ALPHABET))
    pol = LLMPolicy(model, tok, lora=LoraSpec(r=4, alpha=8))
    with torch.no_grad():  # a non-zero adapter, so it takes part in the forward
        for name, p in pol.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids, mask = pol.encode_prompts(PROMPTS)
    gen = pol.generate(
        ids, mask, max_new_tokens=6, num_samples=2, generator=torch.Generator().manual_seed(0), keep_cache=True
    )
    rows = (gen.lengths >= 2).nonzero().squeeze(1)
    starts = torch.ones_like(rows)
    br = pol.branch(gen, rows, starts, num_samples=2, max_new_tokens=6, generator=torch.Generator().manual_seed(1))
    scored, _ = pol.completion_logprobs(br.input_ids, br.attention_mask, br.completion_mask)
    torch.testing.assert_close(scored, br.logp, atol=1e-5, rtol=1e-5)
