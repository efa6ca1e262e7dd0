"""Unit tests for grpo_marl.losses: aggregation weights, clipping, KL, GSPO, registries."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_marl.losses import (
    AGGREGATIONS,
    LOSSES,
    GRPOLoss,
    GSPOLoss,
    make_loss,
    register_aggregation,
    register_loss,
    token_weights,
)

T_, F_ = True, False
MASK = torch.tensor([[T_, T_, F_], [T_, F_, F_], [F_, F_, F_]])  # lengths 2, 1, 0


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# ------------------------------------------------------------------------------ token_weights
@pytest.mark.parametrize(
    "mode,max_len,expected,total",
    [
        # per-sequence mean (1/len) then mean over the 2 non-empty sequences (the empty one
        # neither counts nor dilutes)
        ("grpo", None, [[0.25, 0.25, 0], [0.5, 0, 0], [0, 0, 0]], 1.0),
        # one mean over the 3 valid tokens
        ("dapo", None, [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0], [0, 0, 0]], 1.0),
        # constant normalizer B * T = 9, so the weights need not sum to 1
        ("dr_grpo", None, [[1 / 9, 1 / 9, 0], [1 / 9, 0, 0], [0, 0, 0]], 3 / 9),
        ("dr_grpo", 10, [[1 / 30, 1 / 30, 0], [1 / 30, 0, 0], [0, 0, 0]], 3 / 30),
    ],
)
def test_token_weights(mode: str, max_len: int | None, expected, total: float) -> None:
    w = token_weights(MASK, mode, max_len=max_len)
    assert w.dtype == torch.get_default_dtype()
    close(w, expected)
    close(w.sum(), total)


def test_token_weights_dtype_and_empty_mask() -> None:
    w = token_weights(torch.zeros(2, 4, dtype=torch.bool), "grpo", dtype=torch.float64)
    assert w.dtype == torch.float64
    close(w, torch.zeros(2, 4, dtype=torch.float64))


def test_grpo_weights_reproduce_aggregation_under_minibatching() -> None:
    # The reason aggregation is expressed as weights: per-minibatch sums add up to the
    # full-batch loss whatever the split.
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(6, 5, generator=g) < 0.6
    mask[:, 0] = True
    x = torch.randn(6, 5, generator=g)
    w = token_weights(mask, "grpo")
    direct = torch.stack([x[b][mask[b]].mean() for b in range(6)]).mean()
    close((w * x).sum(), direct, atol=1e-6)
    minibatches = (torch.tensor([0, 4]), torch.tensor([1, 2, 3, 5]))
    split = sum((w[idx] * x[idx]).sum() for idx in minibatches)
    close(split, direct, atol=1e-6)


def test_unknown_aggregation_raises_with_names() -> None:
    with pytest.raises(ValueError, match=r"registered:.*dapo.*dr_grpo.*grpo"):
        token_weights(MASK, "sequence_sum")


def test_register_aggregation() -> None:
    @register_aggregation("_test_first_token")
    def first_token(mask: torch.Tensor, max_len: int | None) -> torch.Tensor:
        w = torch.zeros_like(mask)
        w[:, 0] = mask[:, 0]
        return w

    try:
        close(token_weights(MASK, "_test_first_token"), [[1, 0, 0], [1, 0, 0], [0, 0, 0]])
        with pytest.raises(ValueError, match="already registered"):
            register_aggregation("grpo")(first_token)
    finally:
        AGGREGATIONS.pop("_test_first_token")


@pytest.mark.parametrize("shape", [(3,), (2, 3, 4)])
def test_token_weights_needs_2d(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="2-D"):
        token_weights(torch.ones(shape, dtype=torch.bool), "dapo")


# ----------------------------------------------------------------------------------- clipping
def _grad_wrt_logp(loss_fn: GRPOLoss, log_ratio: float, adv: float, w: float = 0.5):
    logp = torch.tensor([log_ratio - 1.0], requires_grad=True)
    old = torch.tensor([-1.0])
    out = loss_fn(logp, old, torch.tensor([adv]), torch.tensor([w]))
    out["loss"].backward()
    return logp.grad.item(), out


@pytest.mark.parametrize(
    "log_ratio,adv,clipped",
    [
        (math.log(1.5), 1.0, True),  # A>0, ratio above 1+eps_high: clipped, no gradient
        (math.log(0.5), -1.0, True),  # A<0, ratio below 1-eps_low: clipped, no gradient
        (math.log(1.1), 2.0, False),  # inside the trust region
        (math.log(0.9), -3.0, False),  # inside the trust region
        (math.log(0.5), 1.0, False),  # A>0 with a low ratio: min picks the unclipped branch
        (math.log(1.5), -1.0, False),  # A<0 with a high ratio: min picks the unclipped branch
    ],
)
def test_clipping_gradient(log_ratio: float, adv: float, clipped: bool) -> None:
    grad, out = _grad_wrt_logp(GRPOLoss(0.2, 0.2), log_ratio, adv, w=0.5)
    ratio = math.exp(log_ratio)
    if clipped:
        assert grad == 0.0
        close(out["clip_fraction"], 1.0)
    else:
        # d/dlogp of -(w * ratio * A) = -w * A * ratio  (surrogate gradient A*ratio*w)
        assert grad == pytest.approx(-0.5 * adv * ratio, rel=1e-6)
        close(out["clip_fraction"], 0.0)


def test_clip_higher_is_asymmetric() -> None:
    sym, asym = GRPOLoss(0.2, 0.2), GRPOLoss(clip_eps_low=0.2, clip_eps_high=0.28)
    # ratio 1.25 with A>0: clipped at 1.2, but inside the raised ceiling 1.28
    assert _grad_wrt_logp(sym, math.log(1.25), 1.0)[0] == 0.0
    assert _grad_wrt_logp(asym, math.log(1.25), 1.0)[0] == pytest.approx(-0.5 * 1.25)
    # the floor is unchanged: ratio 0.75 with A<0 is clipped by both
    assert _grad_wrt_logp(sym, math.log(0.75), -1.0)[0] == 0.0
    assert _grad_wrt_logp(asym, math.log(0.75), -1.0)[0] == 0.0


def test_diagnostics_hand_values() -> None:
    ratios = torch.tensor([1.5, 0.5, 0.5, 1.05])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])  # first two clipped, last two not
    w = torch.full((4,), 0.25)
    ent = torch.tensor([1.0, 2.0, 3.0, 4.0])
    logp = ratios.log() - 2.0
    out = GRPOLoss(entropy_coef=0.1)(logp, torch.full((4,), -2.0), adv, w, entropy=ent)
    close(out["clip_fraction"], 0.5)
    lr = ratios.log()
    close(out["approx_kl"], ((ratios - 1 - lr) * 0.25).sum())
    close(out["ratio_mean"], ratios.mean())
    close(out["ratio_max"], 1.5)
    close(out["entropy"], 2.5)
    close(out["loss_entropy"], -0.1 * 2.5)
    close(out["kl"], 0.0)
    expected_policy = -0.25 * (1.2 * 1 + 0.8 * -1 + 0.5 * 1 + 1.05 * -1)
    close(out["loss_policy"], expected_policy)
    close(out["loss"], expected_policy - 0.25)
    for key in ("clip_fraction", "approx_kl", "kl", "entropy", "ratio_mean", "ratio_max"):
        assert not out[key].requires_grad, key


def test_diagnostics_ignore_padding() -> None:
    # padded entries carry garbage log-probs; with the mask they cannot produce inf/NaN
    logp = torch.tensor([[-1.0, 50.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -50.0]])
    mask = torch.tensor([[T_, F_]])
    w = token_weights(mask, "grpo")
    out = GRPOLoss()(logp, old, torch.ones(1, 2), w, mask=mask)
    close(out["ratio_max"], 1.0)
    out["loss"].backward()
    assert torch.isfinite(logp.grad).all()


# ---------------------------------------------------------------------------------------- KL
def test_k3_kl_nonnegative_and_zero_at_equality() -> None:
    g = torch.Generator().manual_seed(3)
    logp = torch.randn(50, generator=g)
    ref = torch.randn(50, generator=g)
    w = torch.full((50,), 1 / 50)
    loss = GRPOLoss(beta=0.5)
    out = loss(logp, logp, torch.zeros(50), w, ref_logp=ref)
    d = ref - logp
    k3 = torch.exp(d) - d - 1
    assert (k3 >= 0).all()
    close(out["kl"], k3.mean(), atol=1e-5)
    close(out["loss_kl"], 0.5 * k3.mean(), atol=1e-5)

    p = logp.clone().requires_grad_(True)
    out = loss(p, logp, torch.zeros(50), w, ref_logp=logp.clone())
    assert out["kl"].item() == 0.0 and out["loss_kl"].item() == 0.0
    out["loss"].backward()
    # k3 gradient is -(exp(d) - 1) = 0 at d = 0, and A = 0 kills the policy term
    close(p.grad, torch.zeros(50))


def test_beta_zero_needs_no_reference() -> None:
    out = GRPOLoss(beta=0.0)(torch.zeros(3), torch.zeros(3), torch.ones(3), torch.full((3,), 1 / 3))
    close(out["loss_kl"], 0.0)
    close(out["kl"], 0.0)


def test_beta_positive_without_reference_raises() -> None:
    with pytest.raises(ValueError, match="ref_logp"):
        GRPOLoss(beta=0.1)(torch.zeros(3), torch.zeros(3), torch.ones(3), torch.ones(3))


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="advantages shape"):
        GRPOLoss()(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 3))


# ------------------------------------------------------------------------------ loss at ratio 1
def test_loss_at_ratio_one_is_minus_weighted_advantage() -> None:
    # On the first epoch logp == old_logp, so ratio == 1 and the loss is -(w * A).sum().
    # Group-normalized advantages sum to ~0 within each group (and, with equal-length rollouts,
    # so do their weighted sums), so a GRPO loss reads ~0 even while it learns: the *gradient*
    # sum_t w_t * A_t * grad logp_t is not zero because grad logp differs between tokens.
    from grpo_marl.advantages import group_advantages

    g = torch.Generator().manual_seed(4)
    adv = group_advantages(torch.randn(4, 8, generator=g)).reshape(-1)  # 32 rollouts, 1 step
    logp = torch.randn(32, generator=g, requires_grad=True)
    w = token_weights(torch.ones(32, 1, dtype=torch.bool), "grpo").reshape(-1)
    out = GRPOLoss()(logp, logp.detach(), adv, w)
    close(out["loss"], -(w * adv).sum())
    assert abs(out["loss"].item()) < 1e-5
    out["loss"].backward()
    close(logp.grad, -w * adv)  # non-zero gradient despite a ~0 loss
    assert logp.grad.abs().sum() > 0.1


# ---------------------------------------------------------------------------------------- GSPO
def test_gspo_ratio_is_exp_mean_token_log_ratio() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 9.0]])
    old = torch.tensor([[-1.2, -1.7, -0.9], [-0.5, -0.4, -9.0]])
    mask = torch.tensor([[T_, T_, T_], [T_, T_, F_]])
    ratio = GSPOLoss().log_ratio(logp, old, mask).exp()
    s0 = math.exp((0.2 - 0.3 + 0.4) / 3)
    s1 = math.exp((0.2 - 0.3) / 2)
    close(ratio, [[s0, s0, s0], [s1, s1, 1.0]])


def test_gspo_gradient_matches_sequence_objective() -> None:
    # GSPO-token with "grpo" weights must reproduce the sequence-level GSPO gradient
    # of -mean_b(s_b * A_b) when nothing is clipped.
    g = torch.Generator().manual_seed(5)
    mask = torch.tensor([[T_, T_, T_, T_], [T_, T_, F_, F_], [T_, T_, T_, F_]])
    old = torch.randn(3, 4, generator=g, dtype=torch.float64)
    base = old + 0.05 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    a_seq = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    adv = a_seq[:, None].expand(3, 4)
    w = token_weights(mask, "grpo", dtype=torch.float64)

    p1 = base.clone().requires_grad_(True)
    GSPOLoss(clip_eps_low=0.9, clip_eps_high=10.0)(p1, old, adv, w, mask=mask)["loss"].backward()

    p2 = base.clone().requires_grad_(True)
    lengths = mask.sum(1)
    s = torch.exp(torch.where(mask, p2 - old, 0.0).sum(1) / lengths)
    (-(s * a_seq).mean()).backward()
    close(p1.grad, p2.grad, atol=1e-10)


@pytest.mark.parametrize(
    "logp,mask",
    [(torch.zeros(2, 3), None), (torch.zeros(6), torch.ones(6, dtype=torch.bool))],
)
def test_gspo_requires_2d_and_mask(logp: torch.Tensor, mask) -> None:
    with pytest.raises(ValueError, match="GSPOLoss"):
        GSPOLoss()(logp, logp, logp, logp, mask=mask)


# ------------------------------------------------------------------------------------ registry
def test_loss_registry() -> None:
    assert LOSSES["grpo"] is GRPOLoss and LOSSES["gspo"] is GSPOLoss
    loss = make_loss("gspo", clip_eps_low=3e-4, clip_eps_high=4e-4)
    assert isinstance(loss, GSPOLoss) and loss.clip_eps_high == 4e-4
    with pytest.raises(ValueError, match=r"registered:.*grpo.*gspo"):
        make_loss("nope")

    @register_loss("_test_loss")
    class TestLoss(GRPOLoss):
        pass

    try:
        assert isinstance(make_loss("_test_loss"), TestLoss)
        with pytest.raises(ValueError, match="already registered"):
            register_loss("grpo")(TestLoss)
    finally:
        LOSSES.pop("_test_loss")


# --------------------------------------------------------------------------- algorithm seam
def test_algorithm_losses_take_only_the_minibatch() -> None:
    """``Algorithm.loss(mb)``: nothing algorithm-specific is passed to every loss."""
    import inspect

    from grpo_marl.algos import Algorithm, get_algo

    for name in ("grpo", "ppo", "mappo", "ippo"):
        assert list(inspect.signature(get_algo(name).loss).parameters) == ["self", "mb"], name
    assert list(inspect.signature(Algorithm.loss).parameters) == ["self", "mb"]


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "dr_grpo"])
def test_grpo_minibatch_losses_average_to_the_full_batch_loss(resolve, aggregation: str) -> None:
    """GRPO's aggregation weights are normalised over the whole batch; the algorithm scales a
    minibatch's by the number of minibatches, so the mean of the minibatch losses is the loss of
    the whole batch (the gradient does not depend on ``algo.minibatches``)."""
    from grpo_marl.algos.grpo import GRPO
    from grpo_marl.batch import Batch
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.control import ControlTask

    cfg = resolve(
        ["env=cartpole", "algo.group_size=3", "algo.num_groups=4", "algo.beta=0", f"algo.aggregation={aggregation}"]
    )
    task = ControlTask(cfg, get_spec("cartpole"), torch.device("cpu"))
    try:
        algo = GRPO(cfg.algo, task, torch.device("cpu"))
        torch.manual_seed(0)
        lengths = torch.tensor([3, 3, 3, 1, 2, 3, 4, 4, 4, 2, 2, 2])
        mask = torch.arange(4)[None, :] < lengths[:, None]
        data = {
            "obs": torch.randn(12, 4, 4),
            "actions": torch.randint(0, 2, (12, 4)),
            "agent": torch.zeros(12, 4, dtype=torch.long),
            "logp": torch.full((12, 4), -0.69),
            "rewards": torch.randn(12, 4) * mask,
            "mask": mask,
        }
        batch = Batch(data, group_size=3)
        data, _ = algo.prepare(batch)
        assert data is not None
        algo.set_minibatches(1)
        full = algo.loss(data)["loss"]
        n = len(data["advantages"])
        halves = [torch.arange(n)[: n // 2], torch.arange(n)[n // 2 :]]
        algo.set_minibatches(2)
        parts = [algo.loss({k: v[idx] for k, v in data.items()})["loss"] for idx in halves]
        torch.testing.assert_close((parts[0] + parts[1]) / 2, full)
    finally:
        task.close()
