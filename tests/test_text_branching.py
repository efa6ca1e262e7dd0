"""Branch points of text state groups (algo.group_mode=state): where completions branch."""

from __future__ import annotations

import pytest
import torch

from grpo_marl.text.branching import branch_points, budget_error, join_continuations


def test_every_k_tokens_inside_the_completion() -> None:
    lengths = torch.tensor([1, 3, 9, 5])
    rows, starts = branch_points(lengths, rule="every", every=2, points=3)
    # a 1-token completion has no branch point; t <= length - 1 (token t is resampled)
    assert rows.tolist() == [1, 2, 2, 2, 3, 3]
    assert starts.tolist() == [2, 2, 4, 6, 2, 4]


def test_entropy_picks_the_least_certain_tokens() -> None:
    lengths = torch.tensor([4, 2, 5])
    ent = torch.tensor(
        [
            [9.0, 0.1, 0.5, 0.3, 7.0],  # token 0 never (no prefix), token 4 is past the end
            [1.0, 2.0, 3.0, 4.0, 5.0],  # length 2: only token 1
            [0.0, 0.2, 0.2, 0.9, 0.2],  # ties go to the earlier token
        ]
    )
    rows, starts = branch_points(lengths, rule="entropy", every=1, points=2, entropy=ent)
    assert rows.tolist() == [0, 0, 1, 2, 2]
    assert starts.tolist() == [2, 3, 1, 1, 3]
    with pytest.raises(ValueError, match="entropies"):
        branch_points(lengths, rule="entropy", every=1, points=2)


def test_join_continuations_writes_after_the_prefix() -> None:
    comp = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    ids, mask = join_continuations(
        comp, torch.tensor([2, 1]), torch.tensor([[7, 9, 0], [3, 0, 0]]), torch.tensor([[1, 1, 0], [1, 0, 0]]), 5, 0
    )
    assert ids.tolist() == [[1, 2, 7, 9, 0], [5, 3, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]


def test_budget_error_names_the_keys() -> None:
    assert budget_error(2, 3, "state") is None
    msg = budget_error(3, 3, "state")
    assert msg is not None and "text.branch_every=3" in msg and "text.max_new_tokens=3" in msg
