"""Conversational prompts: a prompt is a string or a list of ``{"role", "content"}`` messages (TRL's
conversational format), rendered through the tokenizer's chat template.

``text.chat_template``: ``auto`` renders conversational prompts when the tokenizer has a template
(plain strings are used as they are), ``true`` renders every prompt (a string becomes one user
message), ``false`` never renders (messages are then joined as ``role: content`` lines).
``text.system_prompt`` adds a system message to prompts that have none. Rendering appends the
template's generation prompt (e.g. ``<|im_start|>assistant\\n``), so completions start right after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpo_marl.errors import ConfigError

Prompt = str | list[dict[str, str]]
CHOICES = ("auto", True, False)


def is_conversational(prompt: Any) -> bool:
    return isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "role" in m for m in prompt)


def parse_mode(value: Any) -> str | bool:
    """``auto`` / ``true`` / ``false`` (bools or strings) -> ``"auto"`` / True / False."""
    if isinstance(value, bool) or value == "auto":
        return value
    low = str(value).lower()
    if low in ("true", "false"):
        return low == "true"
    raise ConfigError(f"text.chat_template={value!r} is not valid; choose one of auto, true, false")


def prompt_text(prompt: Prompt) -> str:
    """A readable one-string form of a prompt (no template): for logs and char alphabets."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m['role']}: {m['content']}" for m in prompt)


def render_prompts(
    tokenizer: Any, prompts: Sequence[Prompt], mode: str | bool = "auto", system_prompt: str | None = None
) -> tuple[list[str], bool]:
    """Prompt strings for the tokenizer and whether the chat template was applied (then the
    strings already hold the template's special tokens: tokenize with ``add_special_tokens=False``)."""
    mode = parse_mode(mode)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    conversational = any(is_conversational(p) for p in prompts)
    use = has_template and (mode is True or (mode == "auto" and conversational))
    if mode is True and not has_template:
        raise ConfigError(
            "text.chat_template=true but the tokenizer has no chat template; use text.chat_template=auto or false"
        )
    if not use:
        out = []
        for p in prompts:
            text = prompt_text(p)
            out.append(f"{system_prompt}\n{text}" if system_prompt else text)
        return out, False
    rendered = []
    for p in prompts:
        messages = [{"role": "user", "content": p}] if isinstance(p, str) else [dict(m) for m in p]
        if system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system_prompt})
        rendered.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return rendered, True
