"""GRPO clipped-surrogate loss (and GSPO, its sequence-ratio variant).

The loss is a module that returns *named* terms (``loss_policy``, ``loss_kl``, ``loss_entropy``
and their sum ``loss``) plus detached diagnostics, in the TorchRL style: the trainer logs
everything it gets back and never needs to know which variant it runs. Variants are subclasses
that override small hooks, not ``if loss_type == ...`` branches: :attr:`GRPOLoss.layout` (the
minibatch layout the variant needs), :meth:`GRPOLoss.log_ratio` (the importance ratio, GSPO) and
:meth:`GRPOLoss.policy_objective` (the per-token surrogate, e.g. a user's CISPO); ``forward``
(shape checks, KL, entropy, diagnostics) is shared.

Aggregation over tokens/steps is not done here: the caller passes ``weights`` from
:func:`grpo_marl.losses.aggregation.token_weights` (or a minibatch slice of them), and every term
is ``(weights * per_token_term).sum()``. Diagnostics use the weighted mean
``sum(w * x) / sum(w)`` so they do not depend on the minibatch size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["GRPOLoss", "GSPOLoss"]


def _weighted_mean(weights: Tensor, x: Tensor) -> Tensor:
    """``sum(w * x) / sum(w)``, 0 when the weights sum to 0 (e.g. an all-padding minibatch)."""
    # No .item(): stays on device (no host sync) and still returns 0 for zero total weight.
    total = weights.sum()
    safe_total = torch.where(total == 0, torch.ones_like(total), total)
    return torch.where(total == 0, torch.zeros_like(total), (weights * x).sum() / safe_total)


class GRPOLoss(nn.Module):
    """Clipped policy-gradient surrogate with optional k3 KL penalty and entropy bonus.

    ``ratio = exp(log_ratio)``; per token
    ``surr = min(ratio * A, clamp(ratio, 1 - eps_low, 1 + eps_high) * A)`` and
    ``loss_policy = -(w * surr).sum()``. The KL to a reference policy uses Schulman's k3
    estimator ``exp(ref - logp) - (ref - logp) - 1``: unbiased for KL(pi || ref) under samples of
    pi, always >= 0, and exactly 0 with zero gradient when the policies agree.

    Args:
        clip_eps_low: lower clip range (ratio floor ``1 - eps_low``) for negative advantages.
        clip_eps_high: upper clip range (ratio ceiling ``1 + eps_high``) for positive
            advantages; set above ``clip_eps_low`` for DAPO's "clip-higher", which leaves room
            to raise the probability of unlikely good actions and so delays entropy collapse.
        beta: KL-to-reference coefficient; 0 disables it (no reference policy needed).
        entropy_coef: entropy-bonus coefficient (the loss subtracts ``coef * entropy``).
    """

    #: The minibatch layout the loss needs: ``"step"`` (rows may be flattened to single steps) or
    #: ``"sequence"`` (``[B, T]`` rows with a mask, e.g. a per-sequence ratio). The algorithm reads
    #: it; a variant that needs whole sequences sets it instead of being named in the algorithm.
    layout: str = "step"

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        beta: float = 0.0,
        entropy_coef: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= clip_eps_low <= 1.0:
            raise ValueError(f"clip_eps_low must be in [0, 1], got {clip_eps_low}")
        if clip_eps_high < 0.0:
            raise ValueError(f"clip_eps_high must be >= 0, got {clip_eps_high}")
        if beta < 0.0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        self.clip_eps_low = float(clip_eps_low)
        self.clip_eps_high = float(clip_eps_high)
        self.beta = float(beta)
        self.entropy_coef = float(entropy_coef)

    def extra_repr(self) -> str:
        return (
            f"clip_eps_low={self.clip_eps_low}, clip_eps_high={self.clip_eps_high}, "
            f"beta={self.beta}, entropy_coef={self.entropy_coef}"
        )

    def log_ratio(self, logp: Tensor, old_logp: Tensor, mask: Tensor | None) -> Tensor:
        """Per-token log importance ratio ``log pi(a|s) - log pi_old(a|s)``.

        Subclasses override this to change the ratio (e.g. :class:`GSPOLoss`). Masked entries are
        set to 0 (ratio 1) so padding holding arbitrary log-probs cannot produce inf/NaN that
        would leak through ``0 * inf`` in the weighted sums.
        """
        lr = logp - old_logp
        if mask is not None:
            lr = torch.where(mask, lr, torch.zeros_like(lr))
        return lr

    def policy_objective(self, logp: Tensor, log_ratio: Tensor, advantages: Tensor) -> Tensor:
        """Per-token surrogate to maximise (the policy loss is ``-(w * objective).sum()``).

        The clipped PPO/GRPO surrogate ``min(r * A, clamp(r, 1 - eps_low, 1 + eps_high) * A)``
        with ``r = exp(log_ratio)``; ``advantages`` are detached. Variants override this hook
        (``logp`` carries the gradient for objectives such as a clipped-IS-weight REINFORCE).
        """
        ratio = torch.exp(log_ratio)
        clipped = torch.clamp(ratio, 1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high)
        return torch.minimum(ratio * advantages, clipped * advantages)

    def forward(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        weights: Tensor,
        ref_logp: Tensor | None = None,
        entropy: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Compute the loss terms and diagnostics.

        All tensors share one shape (flat ``[M]`` or ``[B, T]``). ``weights`` are aggregation
        weights (0 at padding); ``mask`` (bool) is optional for GRPO and required by GSPO.
        ``entropy`` may be detached (a diagnostic only, e.g. with ``entropy_coef=0``); the bonus
        term is built only when ``entropy_coef`` is non-zero.

        Returns:
            dict with differentiable ``loss``, ``loss_policy``, ``loss_kl``, ``loss_entropy``
            and detached ``clip_fraction``, ``approx_kl``, ``kl``, ``ratio_mean``, ``ratio_max``,
            plus ``entropy`` when one was passed (no entropy, no key: never a placeholder 0).
        """
        shape = logp.shape
        named = {"old_logp": old_logp, "advantages": advantages, "weights": weights}
        if ref_logp is not None:
            named["ref_logp"] = ref_logp
        if entropy is not None:
            named["entropy"] = entropy
        if mask is not None:
            named["mask"] = mask
        for name, t in named.items():
            if t.shape != shape:
                raise ValueError(f"{name} shape {tuple(t.shape)} must equal logp shape {tuple(shape)}")
        if mask is not None and mask.dtype != torch.bool:
            mask = mask != 0
        if self.beta > 0.0 and ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (log-probs of the reference policy); pass it or set beta=0")

        old_logp = old_logp.detach()
        advantages = advantages.detach()
        weights = weights.detach()

        log_ratio = self.log_ratio(logp, old_logp, mask)
        ratio = torch.exp(log_ratio)
        loss_policy = -(weights * self.policy_objective(logp, log_ratio, advantages)).sum()

        zero = logp.new_zeros(())
        kl_tok: Tensor | None = None
        if ref_logp is not None:
            d = ref_logp.detach() - logp
            if mask is not None:
                d = torch.where(mask, d, torch.zeros_like(d))
            kl_tok = torch.exp(d) - d - 1.0
        if self.beta > 0.0 and kl_tok is not None:
            loss_kl = self.beta * (weights * kl_tok).sum()
        else:
            loss_kl = zero

        if entropy is not None and self.entropy_coef != 0.0:
            loss_entropy = -self.entropy_coef * (weights * entropy).sum()
        else:
            loss_entropy = zero

        loss = loss_policy + loss_kl + loss_entropy

        with torch.no_grad():
            ratio_d = ratio.detach()
            lr_d = log_ratio.detach()
            # The clipped branch is the active minimum exactly when the gradient is zeroed:
            # ratio above the ceiling with A > 0, or below the floor with A < 0.
            is_clipped = ((advantages > 0) & (ratio_d > 1.0 + self.clip_eps_high)) | (
                (advantages < 0) & (ratio_d < 1.0 - self.clip_eps_low)
            )
            active = weights != 0
            if mask is not None:
                active = active & mask
            # max over active tokens without a host sync; 0 when nothing is active
            neg_inf = torch.full_like(ratio_d, float("-inf"))
            ratio_max = torch.where(active, ratio_d, neg_inf).amax() if ratio_d.numel() else zero
            none_active = ratio_max == float("-inf")
            ratio_max = torch.where(none_active, torch.zeros_like(ratio_max), ratio_max)
            zero_d = zero.detach()
            stats = {
                "clip_fraction": _weighted_mean(weights, is_clipped.to(weights.dtype)),
                "approx_kl": _weighted_mean(weights, (ratio_d - 1.0) - lr_d),
                "kl": _weighted_mean(weights, kl_tok) if kl_tok is not None else zero_d,
                "ratio_mean": _weighted_mean(weights, ratio_d),
                "ratio_max": ratio_max.detach(),
            }
            if entropy is not None:
                # only a measured entropy is reported: never a placeholder 0
                stats["entropy"] = _weighted_mean(weights, entropy.detach())

        return {
            "loss": loss,
            "loss_policy": loss_policy,
            "loss_kl": loss_kl,
            "loss_entropy": loss_entropy,
            **stats,
        }


class GSPOLoss(GRPOLoss):
    """GSPO (Zheng et al. 2025): one importance ratio per *sequence*, not per token.

    ``s_b = exp(mean_t (logp - old_logp))`` over the valid tokens of sequence ``b``. Token-level
    ratios of long sequences are noisy and clip token by token; the length-normalized sequence
    ratio matches the sequence-level reward the advantage refers to. We use the GSPO-token form
    ``log_ratio_t = sg[log s_b] + logp_t - sg[logp_t]``: every token's ratio *equals* ``s_b``
    (so clipping acts on whole sequences) while its gradient flows through its own log-prob;
    with "grpo" weights (``1/len_b``) this reproduces the GSPO sequence gradient exactly.
    GSPO needs much smaller clip ranges than GRPO (the paper uses ~3e-4 / 4e-4).
    Inputs must be ``[B, T]`` with a mask.
    """

    layout = "sequence"

    def log_ratio(self, logp: Tensor, old_logp: Tensor, mask: Tensor | None) -> Tensor:
        if mask is None:
            raise ValueError("GSPOLoss needs mask ([B, T] bool) to average log-ratios per sequence")
        if logp.dim() != 2:
            raise ValueError(f"GSPOLoss needs [B, T] inputs, got shape {tuple(logp.shape)}")
        zeros = torch.zeros_like(logp)
        tok = torch.where(mask, logp - old_logp, zeros)
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1).to(logp.dtype)
        seq = tok.sum(dim=1, keepdim=True) / lengths
        lr = seq.detach() + logp - logp.detach()
        return torch.where(mask, lr, zeros)
