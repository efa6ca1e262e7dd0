"""GRPO: group-relative advantages instead of a critic, clipped surrogate, k3 KL to a reference.

The algorithm is env-agnostic: it sees a :class:`~grpo_marl.batch.Batch` whose rollouts are
grouped contiguously and a Task that can score actions (``log_prob``). Control, multi-agent and
text all come through here.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from grpo_marl.advantages import (
    branched_advantages,
    outcome_advantages,
    return_to_go_advantages,
    zero_std_groups,
    zero_std_trees,
)
from grpo_marl.algos import Algorithm, register_algo
from grpo_marl.batch import Batch
from grpo_marl.losses import make_loss, token_weights
from grpo_marl.settings import GRPOSettings
from grpo_marl.tasks.base import P, R, Task


@register_algo("grpo")
class GRPO(Algorithm[P, R]):
    """Group-relative advantages (docs/ARCHITECTURE.md, "The algorithm"). ``cfg`` is the ``algo``
    config section; any Task's policy classes."""

    collector: ClassVar[str] = "episodes"
    split_keys: ClassVar[tuple[str, ...]] = ("algo.num_groups", "vec.num_envs")
    settings = GRPOSettings

    @classmethod
    def derive_sizes(cls, cfg: DictConfig) -> None:
        """One env per group member: the vector width is ``num_groups * group_size``."""
        if not cfg.vec.num_envs:
            cfg.vec.num_envs = int(cfg.algo.num_groups) * int(cfg.algo.group_size)

    def __init__(self, cfg: DictConfig, task: Task[P, R], device: torch.device) -> None:
        super().__init__(cfg, task, device)
        self.loss_fn = make_loss(
            str(cfg.loss),
            clip_eps_low=float(cfg.clip_eps_low),
            clip_eps_high=float(cfg.clip_eps_high),
            beta=float(cfg.beta),
            entropy_coef=float(cfg.entropy_coef),
        )
        # A loss that needs whole sequences (GSPO) says so in its ``layout``; step-level
        # minibatching flattens the [B, T] rows otherwise.
        needs_sequences = getattr(self.loss_fn, "layout", "step") == "sequence"
        self.layout = "sequence" if (needs_sequences or task.minibatch_by == "sequence") else "step"
        self.ref_policy: P | R | None = task.reference_policy() if float(cfg.beta) > 0 else None

    def reference(self) -> nn.Module | None:
        return self.ref_policy

    # -- data ------------------------------------------------------------------------------
    def collect(self) -> Batch:
        """One batch of groups; with ``zero_std=resample`` keep collecting (DAPO dynamic sampling)
        until ``num_groups`` groups carry signal or ``max_resample`` extra collections were made."""
        batch = self.task.collect(self.task.policy)
        if self.cfg.zero_std != "resample":
            return batch
        target = batch.num_groups
        zero_total, groups_total = 0, 0
        kept: list[Batch] = []
        n_kept = 0
        for attempt in range(int(self.cfg.max_resample) + 1):
            if attempt:
                batch = self.task.collect(self.task.policy)
            zero = self.zero_groups(batch)
            zero_total += int(zero.sum())
            groups_total += len(zero)
            if (~zero).any():
                kept.append(batch.select_groups(~zero))
                n_kept += int((~zero).sum())
            if n_kept >= target:
                break
        if not kept:
            batch.metrics["rollout/frac_zero_std_groups_sampled"] = 1.0
            return batch
        out = Batch.cat(kept)
        if out.num_groups > target:
            keep = torch.zeros(out.num_groups, dtype=torch.bool, device=out.mask.device)
            keep[:target] = True
            out = out.select_groups(keep)
        out.metrics = dict(batch.metrics)
        out.metrics["rollout/frac_zero_std_groups_sampled"] = zero_total / max(groups_total, 1)
        out.metrics["rollout/resample_collections"] = float(attempt)
        return out

    def group_returns(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """Per-rollout total reward ``[groups, G]`` and which rollouts have any valid step."""
        mask = batch.grouped("mask")
        returns = (batch.grouped("rewards") * mask).sum(-1)
        return returns, mask.any(-1)

    def zero_groups(self, batch: Batch) -> Tensor:
        """Groups without signal: all returns equal (and, for a batch with branch points, all the
        branch points' values equal to them too)."""
        returns, valid = self.group_returns(batch)
        if "branch_mask" in batch:
            return zero_std_trees(returns, valid, batch.grouped("branch_mask"), batch.grouped("branch_value"))
        return zero_std_groups(returns, valid)

    def advantages(self, batch: Batch) -> Tensor:
        """``[B, T]`` advantages from the configured estimator (pure functions in advantages.py).

        A batch whose rollouts carry branch points (``branch_mask``/``branch_value``: the
        Monte-Carlo values of prefixes, text state groups) adds their segment advantages to the
        outcome advantage, or replaces it, by ``algo.branch_credit``."""
        rewards, mask = batch.grouped("rewards"), batch.grouped("mask")
        if "branch_mask" in batch:
            adv = branched_advantages(
                rewards,
                mask,
                batch.grouped("branch_mask"),
                batch.grouped("branch_value"),
                scale=str(self.cfg.scale),
                credit=str(self.cfg.branch_credit),
            )
        elif self.cfg.advantage == "outcome":
            adv = outcome_advantages(rewards, mask, scale=str(self.cfg.scale))
        else:
            adv = return_to_go_advantages(rewards, mask, gamma=float(self.cfg.gamma), scale=str(self.cfg.scale))
        return adv.reshape(batch.mask.shape)

    def prepare(self, batch: Batch) -> tuple[dict[str, Tensor] | None, dict[str, float]]:
        """Advantages, aggregation weights and reference log-probs, laid out for minibatching.

        Returns ``(None, metrics)`` when no group carries signal (all-equal rewards) and the loss
        would be exactly zero, so the update is skipped and ``train/skipped_updates`` says why. With
        a KL term or an entropy bonus the loss of such a batch still has a gradient, so it trains
        (unless ``zero_std`` asked to drop zero-variance groups, which leaves nothing).
        """
        zero = self.zero_groups(batch)
        metrics = {"rollout/frac_zero_std_groups": float(zero.float().mean())}
        if self.cfg.zero_std in ("skip", "resample") and zero.any():
            if zero.all():
                return None, metrics
            batch = batch.select_groups(~zero)
        elif zero.all() and self.zero_advantage_is_exact():
            return None, metrics
        adv = self.advantages(batch)
        weights = token_weights(batch.mask, str(self.cfg.aggregation))
        keys = list(self.task.input_keys) + ["logp"]
        if self.layout == "step":
            m = batch.mask
            data = {k: batch[k][m] for k in keys}
            data["advantages"] = adv[m]
            data["weights"] = weights[m]
        else:
            data = {k: batch[k] for k in keys}
            data.update(advantages=adv, weights=weights, mask=batch.mask)
            # Each row's group, so micro-batches can keep a group's rows together (one shared prompt
            # forward per group and micro-batch, see micro_batches).
            data["group"] = torch.arange(batch.num_groups, device=adv.device).repeat_interleave(batch.group_size)
            for k in self.task.extra_keys:
                data[k] = batch[k]
        if self.ref_policy is not None:
            with torch.no_grad():
                data["ref_logp"] = self._ref_logp(self.ref_policy, data)
        metrics["train/advantage_abs_mean"] = float((adv.abs() * batch.mask).sum() / batch.mask.sum())
        return data, metrics

    def _ref_logp(self, ref: P | R, data: dict[str, Tensor]) -> Tensor:
        out, _ = self.task.log_prob(ref, data, need_entropy=False)
        return out.detach()

    # -- loss ------------------------------------------------------------------------------
    def loss(self, mb: dict[str, Tensor]) -> dict[str, Tensor]:
        """The clipped surrogate + KL on one minibatch. Aggregation weights are normalised over
        the whole batch, so a minibatch's are scaled by the number of minibatches."""
        mb = self.rows_with_signal(mb)
        # Without an entropy bonus the task still returns the entropy where it costs nothing extra
        # (detached: no backward through it), so train/entropy is the policy's, not a placeholder.
        logp, entropy = self.task.log_prob(self.task.policy, mb, need_entropy=self.cfg.entropy_coef > 0)
        return self.loss_fn(
            logp,
            mb["logp"],
            mb["advantages"],
            mb["weights"] * float(self.minibatches),
            ref_logp=mb.get("ref_logp"),
            entropy=entropy,
            mask=mb.get("mask"),
        )

    def minibatch_indices(self, data: dict[str, Tensor], k: int) -> list[Tensor]:
        """``minibatch_split=groups`` (sequence layout): whole groups per minibatch, the groups
        with signal dealt out first so each minibatch gets an equal share of them (a stratified
        random split). Why: an LLM's update pays one prompt forward per distinct prompt in a
        minibatch; random rows put most of the batch's prompts in every minibatch (8 groups in 4
        minibatches of 16 random rows: ~6 prompts each), whole groups one or two. Every step's
        gradient then also contrasts whole groups, as in TRL's micro-batches. Falls back to random
        rows when there are fewer groups than minibatches."""
        if self.layout != "sequence" or str(self.cfg.minibatch_split) != "groups" or "group" not in data:
            return super().minibatch_indices(data, k)
        group = data["group"]
        n_groups = int(group.max()) + 1 if group.numel() else 0
        if n_groups < k or group.numel() % n_groups:
            return super().minibatch_indices(data, k)
        size = group.numel() // n_groups
        if self.zero_advantage_is_exact():
            live = (data["advantages"] != 0).reshape(n_groups, -1).any(1).cpu()
        else:
            live = torch.ones(n_groups, dtype=torch.bool)
        ids = torch.arange(n_groups)
        order = torch.cat([ids[live][torch.randperm(int(live.sum()))], ids[~live][torch.randperm(int((~live).sum()))]])
        offsets = torch.arange(size)
        return [(order[j::k].sort().values[:, None] * size + offsets).reshape(-1) for j in range(k)]

    def micro_batches(self, mb: dict[str, Tensor]) -> list[tuple[dict[str, Tensor], float]]:
        """``micro_batch_rows > 0`` (sequence layout): the minibatch's rows with signal, ordered by
        group and cut into pieces of at most that many rows. Exact: the aggregation weights are
        normalised over the whole batch (:meth:`prepare`), so the loss is a plain sum over rows and
        the pieces' gradients add up to the minibatch's. Why: an LLM's activations for the backward
        pass grow with the tokens of a forward, prompts included (SmolLM2-135M keeps ~1 MB per
        token); ordering by group keeps each piece's rows on few prompts, whose forward is shared."""
        rows = int(self.cfg.micro_batch_rows)
        if rows <= 0 or self.layout != "sequence":
            return [(mb, 1.0)]
        mb = self.rows_with_signal(mb)
        b = mb["advantages"].shape[0]
        if b <= rows:
            return [(mb, 1.0)]
        order = torch.argsort(mb["group"], stable=True)
        weights = mb["weights"].reshape(b, -1).sum(1)
        total = float(weights.sum())
        out = []
        for part in order.tensor_split(-(-b // rows)):
            piece = {
                k: v.index_select(0, part) if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == b else v
                for k, v in mb.items()
            }
            share = float(weights[part].sum()) / total if total > 0 else len(part) / b
            out.append((piece, share))
        return out

    def zero_advantage_is_exact(self) -> bool:
        """Whether a rollout with zero advantage adds nothing to the loss or its gradient: true
        without a KL term (``beta``) and without an entropy bonus, which both still pull on it."""
        return float(self.cfg.beta) == 0.0 and float(self.cfg.entropy_coef) == 0.0

    def rows_with_signal(self, mb: dict[str, Tensor]) -> dict[str, Tensor]:
        """The minibatch without its rollouts whose advantage is zero everywhere, when that is
        exact: without a KL term or entropy bonus such a rollout's loss term is ``w * min(r * 0,
        clip(r) * 0) = 0`` and so is its gradient, and the aggregation weights were normalised over
        the whole batch in :meth:`prepare`, so the loss and its gradient are unchanged. Why: the
        members of an all-equal group (every completion right, or every one wrong) all have zero
        advantage, and on a pretrained LLM that is half the groups or more; scoring them was half
        the cost of an update. Sequence layout only (one row = one rollout); the loss statistics
        (clip fraction, ratios) then describe the rows that carry signal. An all-zero minibatch
        keeps one row, so the optimizer still steps on a (zero) gradient as it would have."""
        if self.layout != "sequence" or "ref_logp" in mb or not self.zero_advantage_is_exact():
            return mb
        adv = mb["advantages"]
        b = adv.shape[0]
        live = (adv != 0).reshape(b, -1).any(1)
        if bool(live.all()):
            return mb
        if not bool(live.any()):
            live = live.clone()
            live[0] = True
        idx = live.nonzero().squeeze(1)
        return {k: v[idx] if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == b else v for k, v in mb.items()}

    def after_update(self) -> None:
        """Iterative GRPO: refresh the reference every ``ref_refresh`` updates (0 = frozen)."""
        super().after_update()
        k = int(self.cfg.ref_refresh)
        if self.ref_policy is not None and k > 0 and self.updates % k == 0:
            self.ref_policy.load_state_dict(self.task.policy.state_dict())

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"updates": self.updates}
        if self.ref_policy is not None:
            state["ref_policy"] = self.ref_policy.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.ref_policy is not None and "ref_policy" in state:
            self.ref_policy.load_state_dict(state["ref_policy"])
