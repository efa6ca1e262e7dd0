"""PPO loss: clipped surrogate + (optionally clipped) value regression + entropy bonus.

Same shape as :class:`~grpo_marl.losses.grpo.GRPOLoss`: a module returning named ``loss_*`` terms
and detached diagnostics, so the trainer logs whatever comes back. Unlike the GRPO loss it takes
per-minibatch means (as SB3 and CleanRL do) rather than aggregation weights: PPO's minibatches are
flat, equal-sized step samples, so a mean *is* the aggregation and the PPO baseline stays
step-for-step comparable with Stable-Baselines3.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["PPOLoss"]


class PPOLoss(nn.Module):
    """``loss = loss_policy + vf_coef * value_mse - ent_coef * entropy`` (each term returned).

    Args:
        clip_eps: ratio clip range, ``clamp(ratio, 1 - eps, 1 + eps)``.
        clip_vf: value clip range around the old value prediction (SB3 ``clip_range_vf``); ``None``
            or ``<= 0`` regresses the value without clipping (SB3's default). Clipping takes the
            elementwise max of the clipped and unclipped squared errors (CleanRL/OpenAI baselines).
        vf_coef: weight of the value loss (shared optimizer with the actor).
        entropy_coef: entropy-bonus weight.
    """

    def __init__(
        self,
        clip_eps: float = 0.2,
        clip_vf: float | None = None,
        vf_coef: float = 0.5,
        entropy_coef: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0.0 < clip_eps < 1.0:
            raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps}")
        if vf_coef < 0 or entropy_coef < 0:
            raise ValueError(f"vf_coef and entropy_coef must be >= 0, got {vf_coef}, {entropy_coef}")
        self.clip_eps = float(clip_eps)
        self.clip_vf = float(clip_vf) if clip_vf is not None and clip_vf > 0 else None
        self.vf_coef = float(vf_coef)
        self.entropy_coef = float(entropy_coef)

    def extra_repr(self) -> str:
        return (
            f"clip_eps={self.clip_eps}, clip_vf={self.clip_vf}, vf_coef={self.vf_coef}, "
            f"entropy_coef={self.entropy_coef}"
        )

    def value_loss(self, values: Tensor, old_values: Tensor, returns: Tensor) -> Tensor:
        """Mean squared error to the returns, pessimistically clipped around ``old_values``."""
        unclipped = (values - returns).square()
        if self.clip_vf is None:
            return unclipped.mean()
        clipped_values = old_values + (values - old_values).clamp(-self.clip_vf, self.clip_vf)
        return torch.maximum(unclipped, (clipped_values - returns).square()).mean()

    def forward(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        entropy: Tensor | None = None,
        clip_eps: float | None = None,
    ) -> dict[str, Tensor]:
        """All inputs are flat ``[M]``; ``clip_eps`` overrides the constructor's (for schedules).

        Returns:
            differentiable ``loss``, ``loss_policy``, ``loss_value`` (already times ``vf_coef``),
            ``loss_entropy``; detached ``value_mse``, ``clip_fraction``, ``approx_kl``,
            ``ratio_mean``, ``ratio_max``, ``value_clip_fraction`` and ``entropy`` (when passed).
        """
        shape = logp.shape
        for name, t in (
            ("old_logp", old_logp),
            ("advantages", advantages),
            ("values", values),
            ("old_values", old_values),
            ("returns", returns),
        ):
            if t.shape != shape:
                raise ValueError(f"{name} shape {tuple(t.shape)} must equal logp shape {tuple(shape)}")
        eps = self.clip_eps if clip_eps is None else float(clip_eps)
        old_logp, advantages = old_logp.detach(), advantages.detach()
        old_values, returns = old_values.detach(), returns.detach()

        log_ratio = logp - old_logp
        ratio = torch.exp(log_ratio)
        surr = torch.minimum(ratio * advantages, ratio.clamp(1.0 - eps, 1.0 + eps) * advantages)
        loss_policy = -surr.mean()
        value_mse = self.value_loss(values, old_values, returns)
        loss_value = self.vf_coef * value_mse
        zero = logp.new_zeros(())
        loss_entropy = -self.entropy_coef * entropy.mean() if entropy is not None else zero
        loss = loss_policy + loss_value + loss_entropy

        with torch.no_grad():
            r = ratio.detach()
            stats = {
                "value_mse": value_mse.detach(),
                "clip_fraction": ((r - 1.0).abs() > eps).float().mean(),
                "approx_kl": ((r - 1.0) - log_ratio.detach()).mean(),
                "ratio_mean": r.mean(),
                "ratio_max": r.max() if r.numel() else zero.detach(),
                "value_clip_fraction": (
                    ((values.detach() - old_values).abs() > self.clip_vf).float().mean()
                    if self.clip_vf is not None
                    else zero.detach()
                ),
            }
            if entropy is not None:  # only a measured entropy is reported, never a placeholder 0
                stats["entropy"] = entropy.detach().mean()
        return {
            "loss": loss,
            "loss_policy": loss_policy,
            "loss_value": loss_value,
            "loss_entropy": loss_entropy,
            **stats,
        }
