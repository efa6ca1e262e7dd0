"""How per-token (per-step) losses are reduced to one scalar, expressed as weights.

GRPO variants differ in how they average a ``[B, T]`` per-token loss:

* ``grpo`` (DeepSeekMath): mean over each sequence's valid tokens, then mean over sequences.
  Every sequence counts equally, so tokens of long sequences count less.
* ``dapo`` (DAPO): one mean over all valid tokens of the batch; every token counts equally.
* ``dr_grpo`` (Dr. GRPO): sum divided by the constant ``B * max_len``; no length-dependent
  normalizer at all, which removes the length bias of the other two.

Each is written as a weight tensor ``w`` with ``loss = (w * per_token_loss).sum()``. The weights
are computed **once over the whole collected batch**; a minibatch then just sums its slice of
``w * per_token_loss``. Summing the minibatch losses reproduces the full-batch aggregation
exactly, whatever the minibatch split (the algorithm multiplies each minibatch's weights by the
number of minibatches, which the trainer tells it, so the step size does not shrink). Computing a mean inside each minibatch instead
would silently change the aggregation (e.g. "grpo" would weigh sequences by which minibatch they
landed in). New modes are added with :func:`register_aggregation`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpo_marl.registry import Registry

__all__ = ["AggregationFn", "AGGREGATIONS", "register_aggregation", "token_weights"]

#: ``fn(mask, max_len) -> weights``: ``mask`` is a float 0/1 ``[B, T]`` tensor, ``max_len`` the
#: caller's value (may be None); returns ``[B, T]`` weights of the mask's dtype.
AggregationFn = Callable[[Tensor, int | None], Tensor]

#: name -> aggregation; ``algo.aggregation`` accepts every name in it.
AGGREGATIONS: Registry[AggregationFn] = Registry("aggregation", entry_point_group="grpo_marl.aggregations")


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    """Decorator registering an aggregation under ``name`` (usable from user code too)."""

    def decorator(fn: AggregationFn) -> AggregationFn:
        AGGREGATIONS.register(name, fn)
        return fn

    return decorator


@register_aggregation("grpo")
def _grpo(mask: Tensor, max_len: int | None) -> Tensor:
    """Per-sequence mean, then mean over the sequences that have at least one valid token."""
    lengths = mask.sum(dim=1, keepdim=True)
    n_nonempty = (lengths > 0).sum().clamp(min=1).to(mask.dtype)
    return mask / lengths.clamp(min=1.0) / n_nonempty


@register_aggregation("dapo")
def _dapo(mask: Tensor, max_len: int | None) -> Tensor:
    """Token mean over the whole batch."""
    return mask / mask.sum().clamp(min=1.0)


@register_aggregation("dr_grpo")
def _dr_grpo(mask: Tensor, max_len: int | None) -> Tensor:
    """Sum divided by the constant ``B * max_len`` (``max_len`` defaults to ``T``)."""
    B, T = mask.shape
    L = T if max_len is None else max_len
    if L <= 0:
        raise ValueError(f"max_len must be a positive int, got {max_len}")
    return mask / float(max(B, 1) * L)


def token_weights(
    mask: Tensor,
    mode: str,
    max_len: int | None = None,
    *,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Weights ``[B, T]`` such that ``(weights * per_token_loss).sum()`` is the ``mode`` loss.

    Args:
        mask: ``[B, T]`` bool (or 0/1) valid tokens/steps.
        mode: a key of :data:`AGGREGATIONS` (``grpo``, ``dapo``, ``dr_grpo``, ...).
        max_len: the constant length for ``dr_grpo`` (defaults to ``T``); ignored by others.
        dtype: float dtype of the result (default: torch's default dtype).

    Returns:
        ``[B, T]`` float weights, 0 at invalid tokens. An all-invalid mask gives all zeros.
    """
    aggregate = AGGREGATIONS.get(mode)
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ValueError(f"mask must be 2-D [B, T], got shape {tuple(mask.shape)}")
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    m = (mask != 0).to(dtype)
    weights = aggregate(m, max_len)
    if weights.shape != m.shape:
        raise ValueError(f"aggregation {mode!r} returned shape {tuple(weights.shape)}, expected {tuple(m.shape)}")
    return weights
