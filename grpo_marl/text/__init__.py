"""Text-env support around the LLM policy: model loading (HF dir / ``.gguf`` / hub name), chat
prompt rendering, and the optional supervised warm start. The GRPO Task itself is
:class:`grpo_marl.tasks.text.TextTask`; the policy is :class:`grpo_marl.policies.llm.LLMPolicy`."""
