"""A Gymnasium environment for one-shot text generation: observation = prompt, action = completion.

Each episode is a single step: ``reset`` draws a prompt from the chosen split (chat prompts are
observed in their plain-text form), ``step`` scores the completion with the task's weighted
reward functions and terminates. Grouping for GRPO is
the ``seed`` group mode: resetting with the same seed (or ``options={"index": i}``)
yields the same prompt, so G completions of one prompt form a group.

The env is the standard interface (usable by any Gymnasium tooling); the GRPO Task does not
step it per sample but calls ``env.task`` to draw prompts and score whole batches, which keeps
Python work per token out of the hot loop.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.text.tasks import TextTask, prompt_text


class TextEnv(gym.Env[str, str]):
    """Single-step text environment over a :class:`~envs.text.tasks.TextTask`."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        task: TextTask,
        split: str = "train",
        max_completion_chars: int = 256,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.task = task
        self.split = split
        self.data = task.split(split)
        self.render_mode = render_mode
        texts = [prompt_text(p) for p in task.train.prompts + task.eval.prompts]
        charset = "".join(sorted(set(task.alphabet) | set("".join(texts))))
        max_prompt = max(len(p) for p in texts)
        self.observation_space = spaces.Text(max_length=max_prompt, min_length=0, charset=charset)
        self.action_space = spaces.Text(max_length=max_completion_chars, min_length=0, charset=charset)
        self._index: int | None = None
        self._last: tuple[str, float] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Draw a prompt (uniformly, or ``options={"index": i}``); info has answer and index."""
        super().reset(seed=seed)
        if options and "index" in options:
            idx = int(options["index"])
            if not 0 <= idx < len(self.data):
                raise IndexError(f"prompt index {idx} out of range for {len(self.data)} {self.split} prompts")
        else:
            idx = int(self.np_random.integers(len(self.data)))
        self._index = idx
        self._last = None
        return prompt_text(self.data.prompts[idx]), {
            "index": idx,
            "answer": self.data.answers[idx],
            "split": self.split,
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score the completion; the episode always terminates after one step."""
        if self._index is None:
            raise RuntimeError("TextEnv.step called before reset")
        prompt, answer = self.data.prompts[self._index], self.data.answers[self._index]
        total, per, acc = self.task.score([prompt], [str(action)], [answer])
        prompt = prompt_text(prompt)
        info: dict[str, Any] = {f"reward/{k}": float(v[0]) for k, v in per.items()}
        info["accuracy"] = float(acc[0])
        info["answer"] = answer
        self._last = (str(action), float(total[0]))
        return prompt, float(total[0]), True, False, info

    def render(self) -> str | None:
        """``ansi``: the current prompt, the last completion and its reward."""
        if self.render_mode != "ansi" or self._index is None:
            return None
        text = prompt_text(self.data.prompts[self._index])
        if self._last is not None:
            text += f"{self._last[0]}    [reward {self._last[1]:.3f}]"
        return text

    def score_batch(
        self, indices: np.ndarray, completions: list[str]
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """Batched scoring for trainers: rewards for ``completions`` of this split's ``indices``."""
        prompts = [self.data.prompts[i] for i in indices]
        answers = [self.data.answers[i] for i in indices]
        return self.task.score(prompts, completions, answers)
