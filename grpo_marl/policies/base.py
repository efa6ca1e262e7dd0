"""The policy seams: what each consumer asks of a policy, as structural Protocols.

Two kinds of policy are trained here, and they share no acting interface: a control actor maps
observations to actions (``act``), scores stored actions (``log_prob``, with their entropy from
the same forward) and converts actions to what the vector env takes (``to_env``); a text policy
samples token completions for prompts (``generate``), decodes them, and scores completions
(``completion_logprobs``). A single protocol over both would need ``*args: Any`` signatures and
would check nothing, so each kind has its own:

* :class:`ActingPolicy`: what the evaluation loop drives (:func:`grpo_marl.collectors.evaluate_policy`):
  ``act`` + ``to_env`` + ``groups``. The trained actor, the scripted references of
  :mod:`grpo_marl.marl.references` and the benchmark peers all fill it.
* :class:`Policy`: a trainable control actor, what the collectors and
  :class:`~grpo_marl.tasks.control.ControlTask` use: :class:`~grpo_marl.policies.mlp.ActorPolicy`
  (vector observations through the MLP, image observations through the Nature-CNN encoder of
  :mod:`grpo_marl.policies.cnn`: one class, ``policy.encoder`` picks the encoder).
* :class:`HostPolicy`: the numpy snapshot a :class:`Policy` may offer for the CPU hot loops
  (:class:`~grpo_marl.policies.host.HostActor`; ``host_actor()`` returns None where it does not apply).
* :class:`SequenceScorer` / :class:`TextPolicy`: scoring completions (the text policy and its KL
  reference alike) / the whole text policy (:class:`~grpo_marl.policies.llm.LLMPolicy`).

The Task seam itself (:class:`grpo_marl.tasks.base.Task`) is generic in the policy class it
trains, bound to ``nn.Module`` (the trainer optimizes, checkpoints and broadcasts it as one);
these protocols say what the family-specific code calls on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from grpo_marl.groups import AgentGroups
    from grpo_marl.policies.llm import Generation


@runtime_checkable
class ActingPolicy(Protocol):
    """What the evaluation loop drives: :class:`~grpo_marl.policies.mlp.ActorPolicy`, the scripted
    references of :mod:`grpo_marl.marl.references`, and the benchmark peers (SB3's model) alike, so
    every figure on one table comes from this one loop."""

    groups: AgentGroups

    def act(self, obs: Tensor, action_mask: Tensor | None = ..., deterministic: bool = ...) -> tuple[Tensor, Any]:
        """``obs[E, A, ...]`` -> actions ``[E, A, ...]`` (and log-probs; a peer may return
        something else there, the evaluation loop does not read it)."""
        ...

    def to_env(self, actions: Tensor) -> np.ndarray:
        """Actions as the vector env takes them."""
        ...


@runtime_checkable
class HostPolicy(Protocol):
    """A numpy snapshot of a control actor for the CPU hot loops (:mod:`grpo_marl.policies.host`)."""

    def greedy(self, obs: np.ndarray, action_mask: np.ndarray | None = None) -> np.ndarray:
        """Env actions of the mode."""
        ...

    def sample(
        self, obs: np.ndarray, action_mask: np.ndarray | None, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions (as stored for the update) and their float32 log-probs ``[E, A]``."""
        ...

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Sampled actions as the env takes them."""
        ...


@runtime_checkable
class Policy(ActingPolicy, Protocol):
    """A trainable control actor over the ``[E, A, ...]`` vector layout.

    ``act`` samples (or, ``deterministic``, takes the mode of) actions ``[E, A]`` / ``[E, A, k]``
    and their log-probs ``[E, A]``; ``log_prob`` scores flat step rows (``obs[M, ...]``,
    ``agent[M]``, ``actions[M, ...]``) and returns ``(log_prob, entropy)``, both ``[M]`` and
    differentiable (the entropy comes from the same forward, so there is no separate
    ``entropy`` method); ``to_env`` converts sampled actions to the env's (clipped to Box bounds) as
    numpy, and :class:`~grpo_marl.policies.mlp.ActorPolicy` also offers ``env_actions``, the same as
    a tensor on its device, which the collectors hand to ``VecEnv.step`` (no host round trip);
    ``host_actor`` is the numpy snapshot for the CPU loops, or None where it does not apply."""

    @property
    def action_dtype(self) -> torch.dtype:
        """dtype of stored actions (long for discrete, float32 for Box)."""
        ...

    def action_shape(self) -> tuple[int, ...]:
        """Per-agent action shape in batches: ``()`` (discrete) or ``(k,)`` (Box)."""
        ...

    def act(
        self, obs: Tensor, action_mask: Tensor | None = None, deterministic: bool = False
    ) -> tuple[Tensor, Tensor]: ...

    def log_prob(
        self, obs: Tensor, agent: Tensor, actions: Tensor, action_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]: ...

    def host_actor(self) -> HostPolicy | None: ...


@runtime_checkable
class SequenceScorer(Protocol):
    """Scores completions: a text policy, or its KL reference (a frozen copy, or the LoRA base
    model with the adapter disabled)."""

    def completion_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        completion_mask: Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        model: nn.Module | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``logp[B, T]`` of the completion tokens (0 where masked) and their entropies, or None."""
        ...


@runtime_checkable
class TextPolicy(SequenceScorer, Protocol):
    """A causal-LM policy: samples completions for left-padded prompts, decodes and scores them
    (:class:`~grpo_marl.policies.llm.LLMPolicy`)."""

    tokenizer: Any  # a transformers tokenizer (no stubs)
    pad_id: int

    @property
    def device(self) -> torch.device: ...

    def encode_prompts(self, prompts: Sequence[str], *, add_special_tokens: bool = True) -> tuple[Tensor, Tensor]: ...

    def decode(self, completion_ids: Tensor, completion_mask: Tensor) -> list[str]: ...

    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        greedy: bool = False,
        num_samples: int = 1,
        generator: torch.Generator | None = None,
        keep_cache: bool = False,
        with_entropy: bool = False,
    ) -> Generation: ...

    def branch(
        self,
        gen: Generation,
        rows: Tensor,
        starts: Tensor,
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """Continuations from prefixes of ``gen``'s completions (state groups)."""
        ...

    def reference(self) -> SequenceScorer:
        """The frozen reference policy of the KL term."""
        ...


if TYPE_CHECKING:
    # The implementations fill their protocols structurally (no base class); these assignments
    # make mypy check it where the classes are defined.
    from grpo_marl.marl.references import ScriptedPolicy
    from grpo_marl.policies.host import HostActor
    from grpo_marl.policies.llm import AdapterDisabledReference, LLMPolicy
    from grpo_marl.policies.mlp import ActorPolicy

    def _conformance(
        actor: ActorPolicy, host: HostActor, llm: LLMPolicy, ref: AdapterDisabledReference, scripted: ScriptedPolicy
    ) -> None:
        _policy: Policy = actor
        _host: HostPolicy = host
        _acting: list[ActingPolicy] = [actor, scripted]
        _text: TextPolicy = llm
        _scorers: list[SequenceScorer] = [llm, ref, llm.reference()]


__all__ = ["ActingPolicy", "HostPolicy", "Policy", "SequenceScorer", "TextPolicy"]
