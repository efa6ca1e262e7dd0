"""Advantage estimators: pure functions on dense, masked tensors.

GRPO has no critic: a rollout's advantage is its reward *relative to the other members of its
group* (rollouts that share a starting point, see docs/ARCHITECTURE.md, "The algorithm"). Everything here is a
stateless function of ``[groups, G]`` or ``[groups, G, T]`` tensors plus boolean masks, so the
estimators can be unit-tested by hand and swapped without touching the collector or the loss.
GAE for the PPO baseline lives here too, so that comparisons differ only in the estimator.

Conventions
-----------
* ``mask`` is a bool tensor of the same shape as the rewards; ``True`` marks a valid member /
  step. Invalid entries may hold anything (even NaN): they are never read and come back as 0.
* No function modifies its inputs in place.
* Integer / bool rewards are promoted to the default float dtype; float32 and float64 are kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from grpo_marl.groups import AgentGroups

__all__ = [
    "SCALES",
    "group_advantages",
    "zero_std_groups",
    "discounted_returns",
    "outcome_advantages",
    "return_to_go_advantages",
    "BRANCH_CREDITS",
    "segment_advantages",
    "branch_value_scale",
    "branched_advantages",
    "zero_std_trees",
    "gae",
]

#: Valid values of the ``scale`` argument.
#: ``group``: divide by the per-group std (DeepSeekMath / TRL default);
#: ``batch``: divide by one std over the whole batch (TRL ``scale_rewards="batch"``), which
#: keeps the relative size of advantages across easy and hard groups;
#: ``none``: mean-only (Dr. GRPO), which avoids up-weighting near-constant groups.
SCALES: tuple[str, ...] = ("group", "batch", "none")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _as_float(x: Tensor, name: str) -> Tensor:
    """Return ``x`` as a floating tensor (promoting ints/bools); float32/64 pass through."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_floating_point():
        return x
    return x.to(torch.get_default_dtype())


def _as_mask(mask: Tensor | None, like: Tensor, name: str = "mask") -> Tensor:
    """Validate a boolean mask of ``like``'s shape; ``None`` means all valid."""
    if mask is None:
        return torch.ones(like.shape, dtype=torch.bool, device=like.device)
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.shape != like.shape:
        raise ValueError(f"{name} shape {tuple(mask.shape)} must equal the rewards shape {tuple(like.shape)}")
    # Accept 0/1 numeric masks too (e.g. float masks from a storage buffer): non-zero = valid.
    return mask if mask.dtype == torch.bool else mask != 0


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")


def _check_ndim(x: Tensor, ndim: int, name: str, layout: str) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(x.shape)}")


def _center(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Subtract the mean over valid entries of the last dim.

    Returns ``(centered, count)``: ``centered`` is 0 at invalid entries, ``count`` is the number
    of valid entries per row (shape ``values.shape[:-1]``, same dtype as ``values``).
    """
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    v = torch.where(mask, values, zero)
    count = mask.sum(dim=-1).to(values.dtype)
    # Shift by the first valid entry before averaging: equal members then center to exactly 0.
    # (sum/count of equal floats is often off by an ulp, e.g. 3 x 0.99 / 3, and the group std
    # would blow that residue up to advantages of ~0.9 for members that are identical.)
    first = mask.to(values.dtype).argmax(dim=-1, keepdim=True)
    shifted = torch.where(mask, v - torch.gather(v, -1, first), zero)
    mean = shifted.sum(dim=-1) / count.clamp(min=1.0)
    centered = torch.where(mask, shifted - mean.unsqueeze(-1), torch.zeros_like(v))
    return centered, count


def _unbiased_std_rows(centered: Tensor, count: Tensor) -> Tensor:
    """Bessel-corrected std per row of already-centered values (0 where count < 2)."""
    var = centered.pow(2).sum(dim=-1) / (count - 1.0).clamp(min=1.0)
    return torch.where(count >= 2, var.sqrt(), torch.zeros_like(var))


def _unbiased_std_all(values: Tensor, mask: Tensor) -> Tensor:
    """Bessel-corrected std of all valid entries (a 0-d tensor; 0 if fewer than 2 are valid)."""
    flat = values[mask]
    if flat.numel() < 2:
        return torch.zeros((), dtype=values.dtype, device=values.device)
    return flat.std(unbiased=True)


def _safe_div(centered: Tensor, denom: Tensor) -> Tensor:
    """``centered / denom`` with 0 where ``denom == 0`` (only possible with ``eps=0``; then the
    std is 0, so every centered value is 0 too and 0/0 would be NaN instead of "no signal")."""
    safe = torch.where(denom == 0, torch.ones_like(denom), denom)
    return torch.where(denom == 0, torch.zeros_like(centered), centered / safe)


def _normalize_rows(values: Tensor, mask: Tensor, scale: str, eps: float) -> Tensor:
    """Group-relative normalization along the last dim (shared by all GRPO estimators).

    ``batch`` scales by the std of the *centered* values of the whole batch; the caller decides
    whether that is the right batch statistic (``group_advantages`` uses raw rewards instead).
    """
    centered, count = _center(values, mask)
    if scale == "none":
        return centered
    if scale == "group":
        std = _unbiased_std_rows(centered, count)
        adv = _safe_div(centered, std.unsqueeze(-1) + eps)
        # A group with a single valid member has nothing to compare against: no signal.
        return torch.where((count >= 2).unsqueeze(-1) & mask, adv, torch.zeros_like(adv))
    # scale == "batch"
    return _safe_div(centered, _unbiased_std_all(centered, mask) + eps)


# --------------------------------------------------------------------------------------------
# GRPO estimators
# --------------------------------------------------------------------------------------------
def group_advantages(
    rewards: Tensor,
    scale: str = "group",
    eps: float = 1e-6,
    mask: Tensor | None = None,
) -> Tensor:
    """Group-relative advantage of each member of each group.

    ``A[g, i] = (R[g, i] - mean_g R) / s`` where the mean is over the *valid* members of group
    ``g`` and ``s`` depends on ``scale``:

    * ``"group"``: ``std_g R + eps`` with the Bessel-corrected std, as DeepSeekMath and TRL do
      (``torch.std`` default). A group with one valid member gets 0: a lone rollout has no
      baseline, and its unbiased std is undefined.
    * ``"batch"``: ``std(all valid rewards in the batch) + eps`` (TRL ``scale_rewards="batch"``):
      keeps the within-group centering but stops low-variance groups from being blown up.
    * ``"none"``: no division (Dr. GRPO); rewards 10, 5, 2 give 4.33, -0.67, -3.67.

    Args:
        rewards: ``[groups, G]`` per-member scalar reward (e.g. episode return).
        scale: one of :data:`SCALES`.
        eps: added to the std to keep all-equal groups finite (their centered rewards are 0).
        mask: ``[groups, G]`` bool, ``True`` = valid member (default: all valid).

    Returns:
        ``[groups, G]`` advantages, 0 for invalid members.
    """
    _check_scale(scale)
    rewards = _as_float(rewards, "rewards")
    _check_ndim(rewards, 2, "rewards", "[groups, G]")
    mask = _as_mask(mask, rewards)
    if scale == "batch":
        # TRL's batch scale is the std of the raw rewards, not of the group-centered ones: it
        # includes between-group spread, which is the point (easy/hard groups keep their size).
        centered, _ = _center(rewards, mask)
        return _safe_div(centered, _unbiased_std_all(rewards, mask) + eps)
    return _normalize_rows(rewards, mask, scale, eps)


def zero_std_groups(rewards: Tensor, mask: Tensor | None = None, tol: float = 1e-8) -> Tensor:
    """Which groups carry no learning signal because all their valid rewards are equal.

    Such groups get advantage 0 for every member whatever the scale, so the policy gradient
    ignores them. Logging their fraction explains a flat loss; DAPO's dynamic sampling drops and
    resamples them. Groups with 0 or 1 valid members count as zero-std too (no comparison).

    Args:
        rewards: ``[groups, G]``.
        mask: ``[groups, G]`` bool, default all valid.
        tol: rewards whose spread ``max - min`` is ``<= tol`` count as equal.

    Returns:
        ``[groups]`` bool.
    """
    rewards = _as_float(rewards, "rewards")
    _check_ndim(rewards, 2, "rewards", "[groups, G]")
    mask = _as_mask(mask, rewards)
    inf = torch.tensor(float("inf"), dtype=rewards.dtype, device=rewards.device)
    hi = torch.where(mask, rewards, -inf).amax(dim=-1)
    lo = torch.where(mask, rewards, inf).amin(dim=-1)
    spread = hi - lo  # -inf for groups with no valid member
    return (spread <= tol) | (mask.sum(dim=-1) < 2)


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Reverse discounted cumulative sum (return-to-go) along the last (time) dim.

    ``ret[..., t] = sum_{k>=t} gamma^(k-t) * r[..., k] * mask[..., k]``, then 0 where
    ``mask[..., t]`` is False. Masked steps contribute no reward but are not a barrier: with the
    usual right-padded trajectories (valid prefix, padding after the end) this is exactly the
    episode return-to-go.

    Args:
        rewards: ``[..., T]``.
        mask: ``[..., T]`` bool, ``True`` = valid step.
        gamma: discount in ``[0, 1]``.

    Returns:
        ``[..., T]`` in the rewards' dtype.
    """
    rewards = _as_float(rewards, "rewards")
    if rewards.dim() < 1:
        raise ValueError("rewards must have a time dim [..., T], got a 0-d tensor")
    mask = _as_mask(mask, rewards)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    r = torch.where(mask, rewards, torch.zeros((), dtype=rewards.dtype, device=rewards.device))
    T = r.shape[-1]
    out = torch.empty_like(r)
    running = torch.zeros(r.shape[:-1], dtype=r.dtype, device=r.device)
    # A loop over T (vectorized over everything else) keeps exact left-to-right float
    # semantics; a closed form with gamma^-t powers overflows for long horizons.
    for t in range(T - 1, -1, -1):
        running = r[..., t] + gamma * running
        out[..., t] = running
    return torch.where(mask, out, torch.zeros_like(out))


def outcome_advantages(
    rewards: Tensor,
    mask: Tensor,
    scale: str = "group",
    eps: float = 1e-6,
) -> Tensor:
    """Outcome supervision: one advantage per rollout, broadcast to all its valid steps.

    The rollout's total (undiscounted) return is normalized within its group with
    :func:`group_advantages`; this is the LLM-style GRPO where only the final result counts.
    Rollouts with no valid step are invalid members (they neither receive an advantage nor
    shift their group's mean).

    Args:
        rewards: ``[groups, G, T]`` per-step rewards.
        mask: ``[groups, G, T]`` bool valid steps.
        scale, eps: see :func:`group_advantages`.

    Returns:
        ``[groups, G, T]``, 0 at masked steps.
    """
    _check_scale(scale)
    rewards = _as_float(rewards, "rewards")
    _check_ndim(rewards, 3, "rewards", "[groups, G, T]")
    mask = _as_mask(mask, rewards)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    totals = torch.where(mask, rewards, zero).sum(dim=-1)
    member_valid = mask.any(dim=-1)
    adv = group_advantages(totals, scale=scale, eps=eps, mask=member_valid)
    return torch.where(mask, adv.unsqueeze(-1), zero)


def return_to_go_advantages(
    rewards: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    scale: str = "group",
    eps: float = 1e-6,
) -> Tensor:
    """Process supervision for control: per-step group-relative return-to-go.

    DeepSeekMath's process-supervision advantage sums normalized future rewards; for control we
    normalize the discounted return-to-go ``G_t`` directly. At each step ``t``, ``G_t`` of every
    member still alive (``mask[:, :, t]``) is compared with the other alive members of its group
    *at the same t*: members that already ended are excluded, because a finished rollout's
    (zero) future would otherwise bias the baseline of the survivors.

    * ``"group"``: divide by the unbiased std over alive members (+eps); fewer than 2 alive -> 0.
    * ``"batch"``: divide by the std of all valid centered values of the batch (+eps).
    * ``"none"``: mean-only.

    Args:
        rewards: ``[groups, G, T]`` per-step rewards.
        mask: ``[groups, G, T]`` bool valid steps.
        gamma: discount for the return-to-go.
        scale, eps: as above.

    Returns:
        ``[groups, G, T]``, 0 at masked steps.
    """
    _check_scale(scale)
    rewards = _as_float(rewards, "rewards")
    _check_ndim(rewards, 3, "rewards", "[groups, G, T]")
    mask = _as_mask(mask, rewards)
    rtg = discounted_returns(rewards, mask, gamma)
    # Move G to the last dim so each (group, t) row is normalized over its alive members.
    adv = _normalize_rows(rtg.transpose(1, 2), mask.transpose(1, 2), scale, eps)
    return adv.transpose(1, 2).contiguous()


# --------------------------------------------------------------------------------------------
# branching from prefixes (text state groups)
# --------------------------------------------------------------------------------------------
#: How the segment advantage combines with the outcome advantage (:func:`branched_advantages`).
#: ``sum``: outcome + segment (TreeRL's global + local advantage); ``replace``: the segment
#: advantage alone (VinePPO's Monte-Carlo value differences).
BRANCH_CREDITS: tuple[str, ...] = ("sum", "replace")


def _check_branches(mask: Tensor, branch_mask: Tensor, branch_value: Tensor) -> tuple[Tensor, Tensor]:
    branch_mask = _as_mask(branch_mask, mask, "branch_mask")
    branch_value = _as_float(branch_value, "branch_value")
    if branch_value.shape != mask.shape:
        raise ValueError(
            f"branch_value shape {tuple(branch_value.shape)} must equal the mask shape {tuple(mask.shape)}"
        )
    return branch_mask & mask, branch_value


def segment_advantages(
    returns: Tensor,
    valid: Tensor,
    mask: Tensor,
    branch_mask: Tensor,
    branch_value: Tensor,
) -> Tensor:
    """Monte-Carlo value differences between the branch points of each completion (unscaled).

    Completion ``i`` of a group has branch points ``t_1 < ... < t_m`` (``branch_mask[g, i, t]``)
    and at each the Monte-Carlo value ``V(t_j)`` (``branch_value[g, i, t_j]``: the mean return of
    continuations sampled from the prefix ``prompt + completion[:t_j]``). With ``V(t_0)`` the
    prompt's value, the mean return of the group's valid members, and ``V(t_{m+1}) = R_i`` the
    completion's own return, every token ``tau`` of the segment ``t_j <= tau < t_{j+1}`` gets

        ``S[g, i, tau] = V(t_{j+1}) - V(t_j)``

    (the token at a branch point opens the next segment: it is the decision the continuations
    resampled). The segments of a completion telescope: their advantages sum to ``R_i - V(t_0)``,
    the mean-only outcome advantage. A completion without branch points is one segment with
    exactly that advantage.

    Args:
        returns: ``[groups, G]`` completion returns.
        valid: ``[groups, G]`` bool valid members (the prompt value averages these).
        mask: ``[groups, G, T]`` bool valid tokens.
        branch_mask: ``[groups, G, T]`` bool, a branch point at token ``t`` (must be a valid token).
        branch_value: ``[groups, G, T]`` the value at each branch point (read only there).

    Returns:
        ``[groups, G, T]``, 0 at masked tokens.
    """
    returns = _as_float(returns, "returns")
    _check_ndim(returns, 2, "returns", "[groups, G]")
    valid = _as_mask(valid, returns, "valid")
    mask = mask if mask.dtype == torch.bool else mask != 0
    _check_ndim(mask, 3, "mask", "[groups, G, T]")
    if mask.shape[:2] != returns.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must start with the returns shape {tuple(returns.shape)}")
    branch_mask, branch_value = _check_branches(mask, branch_mask, branch_value)
    dtype = torch.promote_types(returns.dtype, branch_value.dtype)
    returns, branch_value = returns.to(dtype), branch_value.to(dtype)
    zero = torch.zeros((), dtype=dtype, device=returns.device)
    count = valid.sum(-1, keepdim=True).clamp(min=1).to(dtype)
    prompt_value = torch.where(valid, returns, zero).sum(-1, keepdim=True) / count  # [groups, 1]
    t_len = mask.shape[-1]
    ar = torch.arange(t_len, device=mask.device).expand(mask.shape)
    # the latest branch point at or before tau (-1: none), the first one after tau (T: none)
    prev_idx = torch.where(branch_mask, ar, torch.full_like(ar, -1)).cummax(-1).values
    later = torch.where(branch_mask, ar, torch.full_like(ar, t_len))
    next_idx = later.flip(-1).cummin(-1).values.flip(-1)
    next_idx = torch.cat([next_idx[..., 1:], torch.full_like(next_idx[..., :1], t_len)], -1)
    v_prev = torch.where(
        prev_idx >= 0, branch_value.gather(-1, prev_idx.clamp(min=0)), prompt_value.unsqueeze(-1).expand(mask.shape)
    )
    v_next = torch.where(
        next_idx < t_len,
        branch_value.gather(-1, next_idx.clamp(max=t_len - 1)),
        returns.unsqueeze(-1).expand(mask.shape),
    )
    keep = mask & valid.unsqueeze(-1)
    return torch.where(keep, v_next - v_prev, zero)


def branch_value_scale(
    returns: Tensor, valid: Tensor, branch_mask: Tensor, branch_value: Tensor, scale: str = "group", eps: float = 1e-6
) -> Tensor:
    """The divisor of the segment advantages, ``[groups, 1, 1]``: the spread of a group's
    Monte-Carlo values (its members' returns and its branch-point values together).

    ``group``: their Bessel-corrected std within each group, + ``eps`` (0 std: every value is
    equal, so every segment advantage is 0 anyway); ``batch``: the std of all of them in the batch,
    + ``eps``; ``none``: 1. Why not the outcome's own divisor: a group whose members all got the same
    return (std 0) can still hold branch points with other values, and that credit is the point of
    branching; the std of the values measured for the prompt keeps it in the same units. When the
    continuations are members of the group too (``text.branch_train``), each carries its prefix's
    value at its start, so that value counts once per continuation as well as on its completion.
    """
    _check_scale(scale)
    returns = _as_float(returns, "returns")
    dtype = torch.promote_types(returns.dtype, _as_float(branch_value, "branch_value").dtype)
    ones = torch.ones((returns.shape[0], 1, 1), dtype=dtype, device=returns.device)
    if scale == "none":
        return ones
    groups = returns.shape[0]
    values = torch.cat([returns.to(dtype), branch_value.to(dtype).reshape(groups, -1)], 1)
    valid_all = torch.cat([_as_mask(valid, returns, "valid"), branch_mask.bool().reshape(groups, -1)], 1)
    if scale == "batch":
        return ones * (_unbiased_std_all(values, valid_all) + eps)
    centered, count = _center(values, valid_all)
    return (_unbiased_std_rows(centered, count) + eps).reshape(groups, 1, 1)


def branched_advantages(
    rewards: Tensor,
    mask: Tensor,
    branch_mask: Tensor,
    branch_value: Tensor,
    scale: str = "group",
    eps: float = 1e-6,
    credit: str = "sum",
) -> Tensor:
    """Outcome advantages plus credit inside each completion from its branch points.

    ``A[g, i, tau] = O[g, i] + S[g, i, tau] / s_g`` (``credit="sum"``) or ``S[g, i, tau] / s_g``
    (``credit="replace"``), where ``O`` is :func:`outcome_advantages` (the prompt-level group
    advantage, as without branching), ``S`` is :func:`segment_advantages` and ``s_g`` is
    :func:`branch_value_scale`. With no branch point anywhere, ``replace`` is the mean-centered
    outcome advantage over ``s_g`` and ``sum`` doubles the outcome's weight; with ``scale="none"``
    and no branch point, ``replace`` equals the outcome advantage exactly.

    Args:
        rewards: ``[groups, G, T]`` per-token rewards (text: the completion's reward on its last token).
        mask: ``[groups, G, T]`` bool valid tokens.
        branch_mask, branch_value: ``[groups, G, T]``, see :func:`segment_advantages`.
        scale, eps: see :func:`group_advantages`.
        credit: one of :data:`BRANCH_CREDITS`.

    Returns:
        ``[groups, G, T]``, 0 at masked tokens.
    """
    if credit not in BRANCH_CREDITS:
        raise ValueError(f"unknown credit {credit!r}; valid: {', '.join(BRANCH_CREDITS)}")
    _check_scale(scale)
    rewards = _as_float(rewards, "rewards")
    _check_ndim(rewards, 3, "rewards", "[groups, G, T]")
    mask = _as_mask(mask, rewards)
    branch_mask, branch_value = _check_branches(mask, branch_mask, branch_value)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    returns = torch.where(mask, rewards, zero).sum(-1)
    valid = mask.any(-1)
    seg = segment_advantages(returns, valid, mask, branch_mask, branch_value)
    seg = seg / branch_value_scale(returns, valid, branch_mask, branch_value, scale, eps)
    if credit == "replace":
        return seg.to(rewards.dtype)
    return (outcome_advantages(rewards, mask, scale=scale, eps=eps) + seg).to(rewards.dtype)


def zero_std_trees(
    returns: Tensor, valid: Tensor, branch_mask: Tensor, branch_value: Tensor, tol: float = 1e-8
) -> Tensor:
    """``[groups]`` bool: groups whose returns and branch-point values are all equal (within
    ``tol``), so :func:`branched_advantages` is 0 for every token. A group whose members all got
    the same return but whose branch points saw other values still carries signal."""
    returns = _as_float(returns, "returns")
    groups = returns.shape[0]
    bm = branch_mask.bool().reshape(groups, -1)
    values = torch.cat([returns, _as_float(branch_value, "branch_value").to(returns.dtype).reshape(groups, -1)], 1)
    ok = torch.cat([_as_mask(valid, returns, "valid"), bm], 1)
    inf = torch.tensor(float("inf"), dtype=values.dtype, device=values.device)
    spread = torch.where(ok, values, -inf).amax(-1) - torch.where(ok, values, inf).amin(-1)
    return spread <= tol


# --------------------------------------------------------------------------------------------
# PPO baseline
# --------------------------------------------------------------------------------------------
def gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    last_values: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016), time-major ``[T, N]``.

    ``delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t`` and
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}``, where ``V_{t+1}`` is
    ``values[t+1]`` or ``last_values`` for the final step. ``dones[t]`` means the episode ended
    *at* step ``t`` (so nothing after it bootstraps into it); truncation is the caller's job: add
    ``gamma * V(final_obs)`` to the reward of a truncated step, as SB3 does, and mark it done.

    Args:
        rewards: ``[T, N]``.
        values: ``[T, N]`` critic values of the observations at each step.
        dones: ``[T, N]`` bool/0-1, episode ended at step t.
        last_values: ``[N]`` value of the observation after step ``T-1``.
        gamma: discount.
        lam: GAE lambda (0 = one-step TD, 1 = Monte-Carlo minus baseline).

    Returns:
        ``(advantages, returns)`` both ``[T, N]``; ``returns = advantages + values`` is the
        critic's regression target (TD(lambda) return).
    """
    rewards = _as_float(rewards, "rewards")
    _check_ndim(rewards, 2, "rewards", "[T, N] (time-major)")
    values = _as_float(values, "values")
    last_values = _as_float(last_values, "last_values")
    if values.shape != rewards.shape:
        raise ValueError(f"values shape {tuple(values.shape)} must equal rewards shape {tuple(rewards.shape)}")
    if not isinstance(dones, Tensor) or dones.shape != rewards.shape:
        got = tuple(dones.shape) if isinstance(dones, Tensor) else type(dones).__name__
        raise ValueError(f"dones shape {got} must equal rewards shape {tuple(rewards.shape)}")
    if last_values.shape != rewards.shape[1:]:
        raise ValueError(f"last_values shape {tuple(last_values.shape)} must be [N] = {tuple(rewards.shape[1:])}")
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    rewards, values, last_values = rewards.to(dtype), values.to(dtype), last_values.to(dtype)
    not_done = 1.0 - (dones != 0).to(dtype)
    T = rewards.shape[0]
    advantages = torch.empty_like(rewards)
    last_gae = torch.zeros_like(last_values)
    next_values = last_values
    for t in range(T - 1, -1, -1):
        delta = rewards[t] + gamma * next_values * not_done[t] - values[t]
        last_gae = delta + gamma * lam * not_done[t] * last_gae
        advantages[t] = last_gae
        next_values = values[t]
    return advantages, advantages + values


def agent_group_returns(returns: Tensor, member_ids: np.ndarray) -> tuple[Tensor, Tensor]:
    """Gather per-rollout returns ``[E * A]`` into ``[groups, width]`` plus the validity mask."""
    ids = torch.as_tensor(member_ids)
    valid = ids >= 0
    gathered = returns[ids.clamp(min=0)]
    return torch.where(valid, gathered, torch.zeros_like(gathered)), valid


def agent_group_advantages(
    returns: Tensor,
    grouping: str,
    num_seed_groups: int,
    group_size: int,
    groups: AgentGroups,
    scale: str = "group",
    eps: float = 1e-6,
) -> Tensor:
    """Outcome advantages of every rollout (``returns[E * A]``, rollout ``e * A + a``) under
    ``grouping``; returns ``[E * A]`` in rollout order. Built on ``group_advantages`` so the
    multi-agent path normalizes exactly like the single-agent one."""
    from grpo_marl.groups import arrange_groups

    ids = arrange_groups(grouping, num_seed_groups, group_size, groups)
    grouped, valid = agent_group_returns(returns, ids)
    adv = group_advantages(grouped, scale=scale, eps=eps, mask=valid)
    out = torch.zeros_like(returns, dtype=adv.dtype)
    flat_ids = torch.as_tensor(ids).reshape(-1)
    keep = flat_ids >= 0
    out[flat_ids[keep]] = adv.reshape(-1)[keep]
    return out
