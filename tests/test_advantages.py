"""Unit tests for grpo_marl.advantages: hand-computed values and naive reference loops."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_marl.advantages import (
    SCALES,
    discounted_returns,
    gae,
    group_advantages,
    outcome_advantages,
    return_to_go_advantages,
    zero_std_groups,
)

T_, F_ = True, False


def close(actual: torch.Tensor, expected, atol: float = 1e-4) -> None:
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# ----------------------------------------------------------------------------- group_advantages
def test_seed_example_mean_only() -> None:
    # rewards 10, 5, 2 -> mean 17/3 -> 4.33, -0.67, -3.67
    adv = group_advantages(torch.tensor([[10.0, 5.0, 2.0]]), scale="none")
    close(adv, [[4.3333, -0.6667, -3.6667]])


def test_group_scale_uses_unbiased_std() -> None:
    # mean 3, centered [-2,-1,0,3], sum sq 14, unbiased var 14/3, std 2.16025
    adv = group_advantages(torch.tensor([[1.0, 2.0, 3.0, 6.0]]), scale="group", eps=0.0)
    close(adv, [[-0.92582, -0.46291, 0.0, 1.38873]])


def test_batch_scale_uses_std_of_all_rewards() -> None:
    # centered within groups: [[-1,1],[-2,2]]; std of {1,3,10,14} (mean 7):
    # sum sq 36+16+9+49 = 110, unbiased var 110/3 -> std 6.05530
    r = torch.tensor([[1.0, 3.0], [10.0, 14.0]])
    adv = group_advantages(r, scale="batch", eps=0.0)
    close(adv, [[-0.16514, 0.16514], [-0.33029, 0.33029]])


def test_masked_members_are_ignored_and_zero() -> None:
    r = torch.tensor([[1.0, float("nan"), 3.0], [5.0, 7.0, 100.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[T_, F_, T_], [T_, T_, F_], [T_, F_, F_]])
    adv = group_advantages(r, scale="group", eps=0.0, mask=m)
    # groups 0 and 1: two valid members 2 apart -> std sqrt(2) -> +-1/sqrt(2);
    # group 2: a single valid member -> no baseline -> 0
    s = 1 / math.sqrt(2)
    close(adv, [[-s, 0.0, s], [-s, s, 0.0], [0.0, 0.0, 0.0]])
    assert not torch.isnan(adv).any()


@pytest.mark.parametrize("eps", [1e-6, 0.0])
@pytest.mark.parametrize("scale", SCALES)
def test_all_equal_group_gives_zero(scale: str, eps: float) -> None:
    # eps=0 must still give 0 (no signal), not 0/0 = NaN
    adv = group_advantages(torch.full((2, 4), 3.5), scale=scale, eps=eps)
    close(adv, torch.zeros(2, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", SCALES)
def test_dtype_preserved_and_zero_mean(dtype: torch.dtype, scale: str) -> None:
    r = torch.randn(5, 6, dtype=dtype, generator=torch.Generator().manual_seed(0))
    r_before = r.clone()
    adv = group_advantages(r, scale=scale)
    assert adv.dtype == dtype
    close(adv.sum(dim=1), torch.zeros(5, dtype=dtype), atol=1e-5)
    torch.testing.assert_close(r, r_before)  # no in-place modification


def test_unknown_scale_lists_valid() -> None:
    with pytest.raises(ValueError, match="group, batch, none"):
        group_advantages(torch.zeros(1, 2), scale="rank")


# ----------------------------------------------------------------------------- zero_std_groups
def test_zero_std_groups() -> None:
    r = torch.tensor([[1.0, 1.0, 1.0], [1.0, 2.0, 1.0], [3.0, 5.0, 3.0]])
    assert zero_std_groups(r).tolist() == [True, False, False]
    m = torch.tensor([[T_, T_, T_], [T_, T_, T_], [T_, F_, T_]])
    assert zero_std_groups(r, mask=m).tolist() == [True, False, True]


# -------------------------------------------------------------------------- discounted_returns
def test_discounted_returns_hand_values() -> None:
    # ret2 = 3, ret1 = 2 + .9*3 = 4.7, ret0 = 1 + .9*4.7 = 5.23, step 3 masked -> 0
    r = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    m = torch.tensor([[T_, T_, T_, F_]])
    close(discounted_returns(r, m, 0.9), [[5.23, 4.7, 3.0, 0.0]])


def test_discounted_returns_matches_loop() -> None:
    g = torch.Generator().manual_seed(1)
    r = torch.randn(3, 4, 7, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, 8, (3, 4), generator=g)
    m = torch.arange(7) < lengths.unsqueeze(-1)
    out = discounted_returns(r, m, 0.9)
    expected = torch.zeros_like(r)
    for i in range(3):
        for j in range(4):
            for t in range(7):
                if m[i, j, t]:
                    expected[i, j, t] = sum(0.9 ** (k - t) * r[i, j, k] for k in range(t, 7) if m[i, j, k])
    close(out, expected, atol=1e-10)


# ------------------------------------------------------------------------- outcome_advantages
def test_outcome_broadcast_and_empty_rollout() -> None:
    r = torch.tensor([[[1.0, 1.0, 1.0], [0.0, 1.0, 5.0], [100.0, 100.0, 100.0]]])
    m = torch.tensor([[[T_, T_, T_], [T_, T_, F_], [F_, F_, F_]]])
    # totals 3 and 1 (the 5 is masked); the third rollout has no valid step -> invalid member
    close(outcome_advantages(r, m, scale="none"), [[[1, 1, 1], [-1, -1, 0], [0, 0, 0]]])
    s = 1 / math.sqrt(2)  # unbiased std of {3, 1} is sqrt(2)
    close(outcome_advantages(r, m, scale="group", eps=0.0), [[[s, s, s], [-s, -s, 0], [0, 0, 0]]])


# -------------------------------------------------------------------- return_to_go_advantages
def _rtg_example() -> tuple[torch.Tensor, torch.Tensor]:
    # member 0: rewards 1,1,1 -> rtg 3,2,1; member 1 dies after step 0: rtg 5,-,-;
    # member 2: rewards 0,4,1 -> rtg 5,5,1 (gamma = 1)
    r = torch.tensor([[[1.0, 1.0, 1.0], [5.0, 9.0, 9.0], [0.0, 4.0, 1.0]]])
    m = torch.tensor([[[T_, T_, T_], [T_, F_, F_], [T_, T_, T_]]])
    return r, m


def test_return_to_go_none_only_alive_members() -> None:
    r, m = _rtg_example()
    adv = return_to_go_advantages(r, m, gamma=1.0, scale="none")
    # t0: {3,5,5} mean 13/3; t1: alive {2,5} mean 3.5 (the dead member 1 is NOT a 0 in the
    # baseline, which would give mean 7/3); t2: {1,1} -> 0
    expected = [[[3 - 13 / 3, -1.5, 0.0], [5 - 13 / 3, 0.0, 0.0], [5 - 13 / 3, 1.5, 0.0]]]
    close(adv, expected)


def test_return_to_go_group_scale() -> None:
    r, m = _rtg_example()
    adv = return_to_go_advantages(r, m, gamma=1.0, scale="group", eps=0.0)
    # t0: centered [-4/3, 2/3, 2/3], unbiased var (24/9)/2 = 4/3; t1: std of {2,5} = sqrt(4.5)
    s0, s1 = math.sqrt(4 / 3), math.sqrt(4.5)
    expected = [
        [
            [(-4 / 3) / s0, -1.5 / s1, 0.0],
            [(2 / 3) / s0, 0.0, 0.0],
            [(2 / 3) / s0, 1.5 / s1, 0.0],
        ]
    ]
    close(adv, expected)


def test_return_to_go_group_single_alive_is_zero() -> None:
    # two members, member 1 dies after step 0: at t>=1 only one is alive -> 0
    r = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]])
    m = torch.tensor([[[T_, T_, T_], [T_, F_, F_]]])
    adv = return_to_go_advantages(r, m, gamma=1.0, scale="group", eps=0.0)
    s = 1 / math.sqrt(2)  # t0: rtg {6, 4}
    close(adv, [[[s, 0.0, 0.0], [-s, 0.0, 0.0]]])


def test_return_to_go_batch_scale() -> None:
    r, m = _rtg_example()
    adv = return_to_go_advantages(r, m, gamma=1.0, scale="batch", eps=0.0)
    # valid centered values: -4/3, 2/3, 2/3, -1.5, 1.5, 0, 0 (mean 0), unbiased over 7
    std = math.sqrt((24 / 9 + 4.5) / 6)
    none = return_to_go_advantages(r, m, gamma=1.0, scale="none")
    close(adv, none / std)


def test_return_to_go_discount() -> None:
    r = torch.tensor([[[1.0, 1.0], [0.0, 0.0]]])
    m = torch.ones(1, 2, 2, dtype=torch.bool)
    # gamma 0.5: member 0 rtg [1.5, 1], member 1 [0, 0]
    adv = return_to_go_advantages(r, m, gamma=0.5, scale="none")
    close(adv, [[[0.75, 0.5], [-0.75, -0.5]]])


# ---------------------------------------------------------------------------------------- gae
def _naive_gae(r, v, d, last_v, gamma, lam):
    """Forward-sum definition: A_t = sum_l (gamma*lam)^l delta_{t+l}, stopping at episode end."""
    T, N = r.shape
    adv = torch.zeros_like(r)
    for n in range(N):
        for t in range(T):
            total, coef = 0.0, 1.0
            for k in range(t, T):
                nv = last_v[n] if k == T - 1 else v[k + 1, n]
                nonterm = 0.0 if d[k, n] else 1.0
                delta = r[k, n] + gamma * nv * nonterm - v[k, n]
                total += coef * delta
                if d[k, n]:
                    break
                coef *= gamma * lam
            adv[t, n] = total
    return adv


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (1.0, 0.0)])
def test_gae_matches_naive(gamma: float, lam: float) -> None:
    g = torch.Generator().manual_seed(2)
    T, N = 9, 4
    r = torch.randn(T, N, generator=g, dtype=torch.float64)
    v = torch.randn(T, N, generator=g, dtype=torch.float64)
    last_v = torch.randn(N, generator=g, dtype=torch.float64)
    d = torch.rand(T, N, generator=g) < 0.25
    d[-1, 0] = True
    adv, ret = gae(r, v, d, last_v, gamma, lam)
    close(adv, _naive_gae(r, v, d, last_v, gamma, lam), atol=1e-10)
    close(ret, adv + v, atol=1e-12)


def test_gae_float32_and_float_dones() -> None:
    r = torch.tensor([[1.0], [1.0]])
    v = torch.tensor([[0.5], [0.5]])
    # step 1 ends the episode: A1 = 1 - .5 = .5; A0 = 1 + .5*.5 - .5 + .5*1*.5 = 1.0
    adv, _ = gae(r, v, torch.tensor([[0.0], [1.0]]), torch.tensor([7.0]), gamma=0.5, lam=1.0)
    assert adv.dtype == torch.float32
    close(adv, [[1.0], [0.5]])


# ------------------------------------------------------------------------------- shape errors
def _ones(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, dtype=torch.bool)


Z = torch.zeros


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: group_advantages(Z(3)), "groups, G"),
        (lambda: group_advantages(Z(2, 3), mask=_ones(2, 2)), "mask shape"),
        (lambda: zero_std_groups(Z(2, 3, 4)), "groups, G"),
        (lambda: discounted_returns(Z(2, 3), _ones(3, 2), 0.9), "mask shape"),
        (lambda: discounted_returns(Z(2, 3), _ones(2, 3), 1.5), "gamma"),
        (lambda: outcome_advantages(Z(2, 3), _ones(2, 3)), "groups, G, T"),
        (lambda: return_to_go_advantages(Z(2, 3), _ones(2, 3)), "groups, G, T"),
        (lambda: gae(Z(4, 2), Z(4, 3), Z(4, 2), Z(2), 0.9, 0.9), "values shape"),
        (lambda: gae(Z(4, 2), Z(4, 2), Z(4, 2), Z(3), 0.9, 0.9), "last_values"),
        (lambda: gae(Z(4, 2), Z(4, 2), Z(2, 4), Z(2), 0.9, 0.9), "dones shape"),
        (lambda: gae(Z(4), Z(4), Z(4), Z(()), 0.9, 0.9), "time-major"),
    ],
)
def test_shape_errors(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- branching (text state groups)
def _tree() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One group of two completions, T = 4. Completion 0 (return 1, 4 tokens) branches at token 2,
    whose continuations averaged 0.5; completion 1 (return 0, 3 tokens) has no branch point."""
    rewards = torch.tensor([[[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]])
    mask = torch.tensor([[[T_, T_, T_, T_], [T_, T_, T_, F_]]])
    bmask = torch.tensor([[[F_, F_, T_, F_], [F_, F_, F_, F_]]])
    bvalue = torch.tensor([[[0.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    return rewards, mask, bmask, bvalue


def test_segment_advantages_by_hand() -> None:
    from grpo_marl.advantages import segment_advantages

    rewards, mask, bmask, bvalue = _tree()
    returns = rewards.sum(-1)
    seg = segment_advantages(returns, mask.any(-1), mask, bmask, bvalue)
    # prompt value 0.5: completion 0's first segment 0.5 - 0.5, its second 1 - 0.5; completion 1: 0 - 0.5
    close(seg, [[[0.0, 0.0, 0.5, 0.5], [-0.5, -0.5, -0.5, 0.0]]])


def test_segment_advantages_two_branch_points_telescope() -> None:
    from grpo_marl.advantages import segment_advantages

    # return 0; branch points at 1 (value 0.75) and 3 (value 0.25); the other member's return is 1
    returns = torch.tensor([[0.0, 1.0]])
    mask = torch.ones((1, 2, 4), dtype=torch.bool)
    bmask = torch.tensor([[[F_, T_, F_, T_], [F_, F_, F_, F_]]])
    bvalue = torch.tensor([[[0.0, 0.75, 0.0, 0.25], [0.0, 0.0, 0.0, 0.0]]])
    seg = segment_advantages(returns, torch.tensor([[T_, T_]]), mask, bmask, bvalue)
    close(seg[0, 0], [0.25, -0.5, -0.5, -0.25])  # 0.75-0.5, 0.25-0.75 (twice), 0-0.25
    close(seg[0, 1], [0.5, 0.5, 0.5, 0.5])
    # the segments (one value per segment) add up to the mean-only outcome advantage R - V0
    assert math.isclose(0.25 - 0.5 - 0.25, 0.0 - 0.5)


def test_branched_advantages_sum_and_replace_by_hand() -> None:
    from grpo_marl.advantages import branched_advantages

    rewards, mask, bmask, bvalue = _tree()
    both = branched_advantages(rewards, mask, bmask, bvalue, scale="none", credit="sum")
    close(both, [[[0.5, 0.5, 1.0, 1.0], [-1.0, -1.0, -1.0, 0.0]]])  # outcome +-0.5 plus the segments
    alone = branched_advantages(rewards, mask, bmask, bvalue, scale="none", credit="replace")
    close(alone, [[[0.0, 0.0, 0.5, 0.5], [-0.5, -0.5, -0.5, 0.0]]])
    # group scale: the outcome over std(1, 0) = 0.7071; the segments over std(1, 0, 0.5) = 0.5
    grp = branched_advantages(rewards, mask, bmask, bvalue, scale="group", credit="sum", eps=0.0)
    o = 0.5 / math.sqrt(0.5)
    close(grp, [[[o, o, o + 1.0, o + 1.0], [-o - 1.0, -o - 1.0, -o - 1.0, 0.0]]])


def test_branched_advantages_credit_an_all_wrong_group() -> None:
    """Every completion failed (no outcome signal), but a prefix of completion 0 succeeded half the
    time: its first segment is credited, what it did after the branch point is blamed."""
    from grpo_marl.advantages import branched_advantages, zero_std_groups, zero_std_trees

    rewards = torch.zeros((1, 2, 3))
    mask = torch.ones((1, 2, 3), dtype=torch.bool)
    bmask = torch.tensor([[[F_, T_, F_], [F_, F_, F_]]])
    bvalue = torch.tensor([[[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]]])
    adv = branched_advantages(rewards, mask, bmask, bvalue, scale="none")
    close(adv, [[[0.5, -0.5, -0.5], [0.0, 0.0, 0.0]]])
    returns = rewards.sum(-1)
    assert bool(zero_std_groups(returns)[0]) and not bool(zero_std_trees(returns, mask.any(-1), bmask, bvalue)[0])
    flat = torch.zeros_like(bvalue)
    assert bool(zero_std_trees(returns, mask.any(-1), bmask, flat)[0])  # every value 0: no signal


def test_branched_advantages_without_branches_is_the_outcome() -> None:
    from grpo_marl.advantages import branched_advantages

    rewards = torch.tensor([[[0.0, 10.0], [5.0, 0.0], [2.0, 0.0]]])
    mask = torch.tensor([[[T_, T_], [T_, F_], [T_, F_]]])
    none = torch.zeros_like(mask)
    got = branched_advantages(rewards, mask, none, torch.zeros_like(rewards), scale="none", credit="replace")
    close(got, outcome_advantages(rewards, mask, scale="none"))
    with pytest.raises(ValueError, match="credit"):
        branched_advantages(rewards, mask, none, torch.zeros_like(rewards), credit="both")
