"""The Task seam: everything env-kind-specific the trainer and the algorithms need.

The trainer never looks at an env, a vector env or a collector: it builds a Task (one per env
kind: ``gym``/``pettingzoo`` share :class:`grpo_marl.tasks.control.ControlTask`, ``text`` has its
own) and calls the methods below. Optional hooks have no-op defaults here, so callers never probe
with ``getattr``.

A Task is generic in the policy class it trains (``P``) and in the class of a KL reference that
is not a copy of the policy (``R``): ``ControlTask`` is ``Task[ActorPolicy, ActorPolicy]``,
``TextTask`` is ``Task[LLMPolicy, AdapterDisabledReference]`` (LoRA's reference is the base model
with the adapter disabled). Both are ``nn.Module`` classes (the trainer optimizes, checkpoints and
broadcasts them); what the family-specific code calls on them is described by the protocols of
:mod:`grpo_marl.policies.base`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from torch import Tensor, nn

from grpo_marl.batch import Batch

if TYPE_CHECKING:
    from grpo_marl.logging import RunLogger

#: The policy class a Task trains.
P = TypeVar("P", bound=nn.Module)
#: The class of a KL reference that is not a copy of the policy (``P`` itself where it always is).
R = TypeVar("R", bound=nn.Module)
M = TypeVar("M", bound=nn.Module)


def frozen_copy(module: M) -> M:
    """A deep copy of ``module`` in eval mode with every parameter frozen."""
    ref = copy.deepcopy(module)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class Task(Generic[P, R]):
    """Base class of every Task. Subclasses set :attr:`policy` and implement the abstract methods.

    input_keys: batch keys the policy needs to score actions (minibatches carry them).
    extra_keys: further per-rollout keys kept in sequence-layout minibatches.
    minibatch_by: ``"step"`` (valid steps are flattened and shuffled) or ``"sequence"`` (whole
    rollouts, e.g. token sequences of a completion).
    threshold_metric: the evaluation metric compared with ``train.threshold``.
    eval_limit: evaluate only the first N episodes of a finite evaluation split (set by
    ``python -m grpo_marl.evaluate episodes=N``; None = the run's own evaluation size).
    """

    policy: P
    input_keys: tuple[str, ...] = ("obs", "actions")
    extra_keys: tuple[str, ...] = ()
    minibatch_by: str = "step"
    threshold_metric: str = "eval/return_mean"
    eval_limit: int | None = None

    # -- counters ------------------------------------------------------------------------------
    @property
    def env_steps(self) -> int:
        """Env steps (or completions, for text) collected by this process so far."""
        raise NotImplementedError

    def set_env_steps(self, steps: int) -> None:
        raise NotImplementedError

    # -- data ----------------------------------------------------------------------------------
    def collect(self, policy: P) -> Batch:
        raise NotImplementedError

    def log_prob(self, policy: P | R, mb: dict[str, Tensor], need_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
        """Differentiable log-probs (and entropies) of ``mb``'s actions under ``policy``.

        ``need_entropy=False``: no gradient is needed through the entropy; return it detached
        (a diagnostic: ``train/entropy``) when the forward computes it anyway, else None (the
        loss then logs no entropy rather than a placeholder 0). ``policy`` is the trained policy
        or its KL reference (:meth:`reference_policy`)."""
        raise NotImplementedError

    def evaluate(self, policy: P, episodes: int, seed_offset: int = 0) -> dict[str, float]:
        raise NotImplementedError

    # -- optional hooks ------------------------------------------------------------------------
    def eval_capacity(self) -> int | None:
        """How many distinct evaluation episodes exist: None when every episode is a fresh
        reset (any number can be run); a text task's held-out prompts are a finite split, so
        asking ``evaluate`` for more of them than it holds is refused rather than quietly cut."""
        return None

    def update_steps(self) -> tuple[int, str, bool] | None:
        """Env steps (completions, for text) one update collects on this process, as ``(steps,
        how, exact)`` (``exact`` False: an upper bound); None when unknown. The trainer warns at
        start when ``total_steps`` is below it (updates are never cut short)."""
        return None

    def reference_policy(self) -> P | R:
        """A frozen copy of the policy for the KL term (LLM tasks with LoRA share the base weights)."""
        return frozen_copy(self.policy)

    def attach_run(self, run_dir: Path, logger: RunLogger, is_main: bool) -> None:
        """Called once the run directory and its logger exist (tasks that log text use it)."""

    def end_update(self, batch: Batch) -> None:
        """After the optimizer step of ``batch`` (e.g. update observation statistics)."""

    def finish(self, run_dir: Path, is_main: bool) -> dict[str, Any]:
        """At the end of training: write artifacts (e.g. a model directory) into ``run_dir``
        and return what ``summary.json`` should say about them."""
        return {}

    def summary_extra(self) -> dict[str, Any]:
        """Task-specific entries of ``summary.json`` (per-agent returns, throughput, ...)."""
        return {}

    # -- resume / end --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
