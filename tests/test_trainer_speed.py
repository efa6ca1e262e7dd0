"""The trainer's cheap paths: fused Adam on the control MLPs and index_select minibatches.

Both are speed choices that must not change what is trained: the optimizer is Adam with the
configured lr/eps (fused: one kernel over all parameters), and a minibatch holds exactly the rows
``value[idx]`` would give.
"""

from __future__ import annotations

from pathlib import Path

import torch

from grpo_marl.batch import minibatch_indices
from grpo_marl.trainer import Trainer
from tests.conftest import resolved_config


def test_control_runs_use_fused_adam_with_the_configured_settings(tmp_path: Path) -> None:
    cfg = resolved_config(["env=cartpole", "algo.lr=0.002", "algo.adam_eps=1e-6", "log.progress=false"])
    trainer = Trainer(cfg, tmp_path)
    try:
        opt = trainer.optimizer
        assert isinstance(opt, torch.optim.Adam)
        group = opt.param_groups[0]
        assert group["fused"] is True
        assert group["lr"] == 0.002 and group["eps"] == 1e-6
        assert sum(len(g["params"]) for g in opt.param_groups) == len(trainer.params)
    finally:
        trainer.close()


def test_index_select_minibatches_equal_advanced_indexing() -> None:
    g = torch.Generator().manual_seed(0)
    data = {
        "obs": torch.randn(37, 4, generator=g),
        "actions": torch.randint(0, 3, (37,), generator=g),
        "seq": torch.randn(37, 5, 2, generator=g),
    }
    for idx in minibatch_indices(37, 4, generator=g):
        for value in data.values():
            assert torch.equal(value.index_select(0, idx), value[idx])
