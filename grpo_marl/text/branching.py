"""Where completions branch (``algo.group_mode=state`` for text envs), as pure tensor functions.

A text env's state is a prefix: the prompt and the first ``t`` tokens of a sampled completion.
:func:`branch_points` picks the prefixes of each completion that get ``text.branch_size``
continuations (:meth:`grpo_marl.policies.llm.LLMPolicy.branch`); the continuations' mean reward is
the Monte-Carlo value of the prefix (:func:`grpo_marl.advantages.branched_advantages`), and
:func:`join_continuations` writes a continuation after its prefix so it is scored as a whole
completion.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: ``text.branch_rule`` values: ``every`` K tokens, or at the ``entropy``-highest tokens.
BRANCH_RULES: tuple[str, ...] = ("every", "entropy")


def branch_points(
    lengths: Tensor,
    *,
    rule: str,
    every: int,
    points: int,
    entropy: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(rows, starts)``: completion ``rows[j]`` branches before its token ``starts[j]``.

    A branch point ``t`` resamples token ``t`` onwards, so it lies inside the completion: ``1 <= t
    <= length - 1`` (a completion of one token has none). ``every``: ``t = every, 2 * every, ...``,
    at most ``points`` of them. ``entropy``: the ``points`` tokens whose sampling distribution had
    the highest entropy (``entropy[B, T]``, from ``generate(with_entropy=True)``; ties to the
    earlier token), the decisions the policy was least sure of. Rows ascend, and starts within a row.
    """
    if rule not in BRANCH_RULES:
        raise ValueError(f"unknown branch rule {rule!r}; valid: {', '.join(BRANCH_RULES)}")
    if points < 1 or every < 1:
        raise ValueError("branch_points: points and every must be >= 1")
    lengths = lengths.to(torch.long)
    dev = lengths.device
    b = lengths.shape[0]
    if rule == "every":
        cand = torch.arange(1, points + 1, device=dev)[None, :].expand(b, points) * every
        ok = cand <= (lengths[:, None] - 1)
    else:
        if entropy is None:
            raise ValueError("branch rule 'entropy' needs the sampled tokens' entropies")
        t_len = entropy.shape[1]
        ar = torch.arange(t_len, device=dev)[None, :]
        inside = (ar >= 1) & (ar <= lengths[:, None] - 1)
        if t_len < 2:
            return torch.zeros(0, dtype=torch.long, device=dev), torch.zeros(0, dtype=torch.long, device=dev)
        # ties to the earlier token: a tiny decreasing offset (topk's order among ties is unspecified)
        score = entropy.double() - ar.double() * 1e-9
        score = score.masked_fill(~inside, float("-inf"))
        k = min(points, t_len - 1)
        top = score.topk(k, dim=1)
        cand, order = top.indices.sort(1)
        ok = torch.isfinite(top.values.gather(1, order))
    rows = torch.arange(b, device=dev)[:, None].expand_as(cand)
    return rows[ok], cand[ok]


def budget_error(every: int, max_new_tokens: int, group_mode: str) -> str | None:
    """The message when ``text.branch_rule=every`` can never branch: every completion is shorter
    than ``text.branch_every + 1`` tokens (None when it can)."""
    if every < max_new_tokens:
        return None
    return (
        f"text.branch_every={every} leaves no branch point inside a completion of at most "
        f"text.max_new_tokens={max_new_tokens} tokens (algo.group_mode={group_mode}); use "
        f"text.branch_every<{max_new_tokens}"
    )


def join_continuations(
    completion_ids: Tensor, starts: Tensor, cont_ids: Tensor, cont_mask: Tensor, width: int, pad_id: int
) -> tuple[Tensor, Tensor]:
    """``[N, width]`` completions ``completion_ids[j, :starts[j]]`` followed by continuation ``j``
    (its ``cont_mask`` tokens), right-padded with ``pad_id``, and their mask."""
    n = starts.shape[0]
    dev = starts.device
    col = torch.arange(width, device=dev)[None, :].expand(n, width)
    t = starts[:, None]
    cont_len = cont_mask.sum(1, keepdim=True)
    in_prefix = col < t
    in_cont = (col >= t) & (col < t + cont_len)
    pre = completion_ids.gather(1, col.clamp(max=completion_ids.shape[1] - 1))
    if cont_ids.shape[1] == 0:
        cont = torch.full_like(col, pad_id)
    else:
        cont = cont_ids.gather(1, (col - t).clamp(0, cont_ids.shape[1] - 1))
    ids = torch.where(in_prefix, pre, torch.where(in_cont, cont, torch.full_like(col, pad_id)))
    return ids, (in_prefix | in_cont).long()


__all__ = ["BRANCH_RULES", "branch_points", "budget_error", "join_continuations"]
