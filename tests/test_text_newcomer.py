"""The text path as a new user meets it: ``env=text_jsonl`` with a real (tokenizer-bearing) model
gets a completion budget that fits its answers in tokens, loading a model keeps third-party
progress bars and warnings off the terminal, and a missing package of the ``text`` extra is one
line naming the extra. Real tiny models (a Llama written to ``.gguf``, a char-tokenizer GPT-2)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import needs
from tests.gguf_helpers import write_tiny_gguf

#: a tiny model written to .gguf and loaded through transformers: the text extra
pytestmark = needs("gguf", "transformers", "tokenizers", "accelerate", extra="text")

ROOT = Path(__file__).resolve().parents[1]
# "café" is 4 characters but 5 byte-level tokens ("é" is two bytes): a character count is not a
# token count.
ANSWERS = ["7", "42", "café"]


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-chat.gguf", max_positions=256)


def _jsonl(path: Path, answers: list[str]) -> Path:
    rows = [{"prompt": [{"role": "user", "content": f"Say {a}."}], "answer": a} for a in answers]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_budget_counts_answer_tokens_of_the_run_tokenizer(gguf_path: Path, tmp_path: Path) -> None:
    from envs.text.tasks import PREAMBLE_TOKENS, answer_token_budget, jsonl_task
    from grpo_marl.text.loading import load_model
    from grpo_marl.tiny_lm import build_char_tokenizer

    _, bpe = load_model(str(gguf_path))
    assert len(bpe("café", add_special_tokens=False)["input_ids"]) == 5
    task = jsonl_task(str(_jsonl(tmp_path / "d.jsonl", ANSWERS)), eval_frac=0.0)
    assert task.budget_from_tokenizer and task.max_new_tokens == 5  # the fallback: 4 characters + EOS
    # pretrained: the longest answer in tokens + EOS + the chat lead-in headroom
    assert PREAMBLE_TOKENS == 16
    assert task.completion_budget(bpe, pretrained=True) == 5 + 1 + 16
    assert task.completion_budget(bpe, pretrained=False) == 5 + 1
    # within the model's context after the longest prompt, but never below answer + EOS
    assert answer_token_budget(ANSWERS, bpe, pretrained=True, room=10) == 10
    assert answer_token_budget(ANSWERS, bpe, pretrained=True, room=3) == 6
    # a model built from scratch (char tokenizer): characters are tokens, the hint is unchanged
    chars = build_char_tokenizer(task.alphabet)
    assert task.completion_budget(chars, pretrained=False) == 4 + 1
    # a budget given in env_kwargs is kept whatever the tokenizer
    fixed = jsonl_task(str(tmp_path / "d.jsonl"), eval_frac=0.0, max_new_tokens=3)
    assert not fixed.budget_from_tokenizer and fixed.completion_budget(bpe, pretrained=True) == 3


def test_text_jsonl_through_model_path_defaults_to_the_token_budget(
    gguf_path: Path, train: Callable[..., dict], tmp_path: Path
) -> None:
    data = _jsonl(tmp_path / "d.jsonl", ANSWERS * 2)
    common = [
        "env=text_jsonl",
        f"+env_kwargs.path={data}",
        "+env_kwargs.eval_frac=0",
        f"model.path={gguf_path}",
        "total_steps=8",
        "algo.num_groups=2",
        "algo.group_size=4",
        "log.tensorboard=false",
        "checkpoint.every=0",
        "model.save=false",
        "threads=1",
    ]
    s = train(tmp_path / "run", *common)
    assert s["text/max_new_tokens"] == 5 + 1 + 16  # not the 5 characters of "café" + EOS
    assert s["env_steps"] == 8
    # text.max_new_tokens still decides when given
    s = train(tmp_path / "fixed", *common, "text.max_new_tokens=7")
    assert s["text/max_new_tokens"] == 7


BAR_MARKS = ("de-quantizing", "Loading weights", "it/s", "\r", "\x1b[")


def test_model_loading_keeps_third_party_bars_and_warnings_off_stderr(
    gguf_path: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from transformers.utils import logging as hf_logging

    from grpo_marl.policies.llm import LLMPolicy
    from grpo_marl.text.loading import SHOW_HF_OUTPUT_ENV, quiet_third_party

    monkeypatch.delenv(SHOW_HF_OUTPUT_ENV, raising=False)
    before = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())
    capfd.readouterr()
    policy = LLMPolicy.from_pretrained(gguf_path)
    policy.save_pretrained(tmp_path / "saved")  # transformers' "Writing model shards" bar
    err = capfd.readouterr().err
    assert not [m for m in BAR_MARKS if m in err], err
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == before  # restored

    # transformers' log warnings and Python warnings inside the block are dropped, not deferred
    logger = hf_logging.get_logger("transformers.newcomer_test")
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_third_party():
            logger.warning("hidden transformers warning")
            warnings.warn("hidden python warning", UserWarning, stacklevel=1)
        logger.warning("visible transformers warning")
        warnings.warn("visible python warning", UserWarning, stacklevel=1)
    assert "hidden" not in caplog.text and "visible transformers warning" in caplog.text
    assert [str(w.message) for w in caught] == ["visible python warning"]
    capfd.readouterr()

    # asked for (GRPO_MARL_HF_OUTPUT=1): transformers' own output is shown as it would be
    monkeypatch.setenv(SHOW_HF_OUTPUT_ENV, "1")
    LLMPolicy.from_pretrained(gguf_path).save_pretrained(tmp_path / "shown")
    err = capfd.readouterr().err
    if before[1]:  # transformers' bars are on in this environment (not HF_HUB_DISABLE_PROGRESS_BARS)
        assert "Loading weights" in err and "Writing model shards" in err
    assert "de-quantizing" in err  # transformers' GGUF reader draws its bar with plain tqdm


def test_missing_accelerate_for_a_gguf_names_the_text_extra(gguf_path: Path, tmp_path: Path) -> None:
    """A real interpreter in which accelerate cannot be imported (``sys.modules`` entry None, set
    before transformers is imported): the run stops before building anything, in one line."""
    data = _jsonl(tmp_path / "d.jsonl", ANSWERS)
    args = [
        "env=text_jsonl",
        f"+env_kwargs.path={data}",
        f"model.path={gguf_path}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "log.progress=false",
    ]
    code = (
        "import runpy, sys; sys.modules['accelerate'] = None; "
        f"sys.argv = ['grpo_marl.train', *{args!r}]; runpy.run_module('grpo_marl.train', run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "accelerate" in x]
    assert len(lines) == 1, proc.stderr
    assert "needs the optional 'text' extra (accelerate is not installed)" in lines[0]
    assert 'pip install -e ".[text]"' in lines[0]
    assert not (tmp_path / "run" / "summary.json").exists()
