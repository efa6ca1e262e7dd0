"""Run logging: TensorBoard scalars, one JSON object per log step in ``metrics.jsonl``, a progress bar.

``metrics.jsonl`` is the machine-readable record (benchmarks read it); every line carries
``step`` (env steps) and namespaced metrics. On resume it is truncated to the checkpoint's step
so the file never holds the same step twice, and TensorBoard drops the points after that step
(``purge_step`` = the first step after the checkpoint): both keep every point up to and
including the checkpoint's step, and the resumed run's points follow without duplicates.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class RunLogger:
    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        tensorboard: bool = True,
        progress: bool = True,
        resume_step: int | None = None,
        enabled: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.writer = None
        self.bar = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            self._truncate(resume_step)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events at steps >= it: the checkpoint's own step was logged before
            # the checkpoint was written and is kept (as in metrics.jsonl), what follows it goes.
            purge = None if resume_step is None else int(resume_step) + 1
            self.writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=purge)
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total_steps,
                initial=resume_step or 0,
                unit="step",
                unit_scale=True,
                dynamic_ncols=True,
                file=sys.stderr,
                mininterval=0.5,
            )
        self._last_step = resume_step or 0

    def _truncate(self, step: int) -> None:
        if not self.metrics_path.exists():
            return
        keep = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except json.JSONDecodeError:
                break  # a torn last line from a killed run
        self.metrics_path.write_text("".join(line + "\n" for line in keep))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _finite(float(v)) for k, v in metrics.items()}}
        try:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:  # a full disk: name the file (a failed write() names none)
            from grpo_marl.errors import FilesystemError, filesystem_message

            message = filesystem_message(exc, self.metrics_path)
            if message is None:
                raise
            raise FilesystemError(message) from exc  # a torn last line is cut on resume (_truncate)
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, float(value), int(step))
        self.progress(step, metrics)

    def progress(self, step: int, metrics: dict[str, float]) -> None:
        if self.bar is None:
            return
        self.bar.update(max(0, int(step) - self._last_step))
        self._last_step = int(step)
        post = {}
        for key, short in (("rollout/return_mean", "return"), ("eval/return_mean", "eval"), ("time/sps", "sps")):
            if key in metrics:
                post[short] = f"{metrics[key]:.4g}"
        if post:
            self.bar.set_postfix(post, refresh=False)

    def text(self, tag: str, text: str, step: int) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, text, int(step))

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
