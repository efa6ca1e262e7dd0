"""State groups: G branches from one snapshot of a state visited in the previous collection.

Each seed-group's first env offers one snapshot at a random time of a collection; the next
collection restores archived snapshots into most groups (``1 - state_reset_frac`` of them; the
rest start from fresh resets, so start states keep covering the reset distribution) and runs each
branch ``branch_horizon`` steps (or to the episode's end), so start states move through whole
episodes at no extra "trunk" cost. A group's members share their start state exactly (physics,
step counter, RNG: the vector env's snapshot contract), so the group's return differences come from
the policy's actions alone. Branch rows are laid out like ``seed`` groups.

``rollout/return_mean`` here: a branch rarely holds a whole episode (Pendulum: 50-step branches of
200-step episodes). An episode ends when a branch reaches the episode's end, and its return is the
whole episode's, the rewards of the chain of earlier branches (earlier collections, earlier
policies) that led to the branch's start state plus the branch's own; its length is the
episode's. Updates in which no episode ended log no return (the first few of a state-group run,
while branch start states move toward the episode's end). ``rollout/frac_restored_groups`` and
``rollout/branch_start_mean`` say how many groups were restored and how deep into their episodes
branches start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from grpo_marl.collectors.base import Storage
from grpo_marl.collectors.episodes import EpisodeCollector
from grpo_marl.errors import UserInputError
from grpo_marl.groups import AgentGroups, GroupMode
from grpo_marl.vec.base import Step, VecEnv

__all__ = ["Archived", "StateGroupCollector"]


@dataclass
class Archived:
    """A snapshot of one env at step ``t`` of its episode plus what the policy saw there."""

    snap: Any
    t: int
    step: Step
    #: per-agent return of the episode up to ``t`` (None: unknown, checkpoints from before it was kept)
    ret: np.ndarray | None = None


class StateGroupCollector(EpisodeCollector):
    """Collects ``num_groups`` groups x ``group_size`` branches per call, most of them restored
    from snapshots archived by the previous collection (any group mode with ``snapshots=True``)."""

    what = "branches"

    def __init__(
        self,
        vec: VecEnv,
        groups: AgentGroups,
        num_groups: int,
        group_size: int,
        mode: str = "state",
        device: torch.device | str = "cpu",
        seed: int = 0,
        max_steps: int | None = None,
        branch_horizon: int = 0,
        state_reset_frac: float = 0.25,
        env_name: str = "env",
        host: bool = True,
    ) -> None:
        super().__init__(vec, groups, num_groups, group_size, mode, device, seed, max_steps, env_name, host)
        if not vec.supports_snapshot:
            vec.snapshot([0])  # raises SnapshotUnsupported naming what to change
        if branch_horizon:
            self.horizon = int(branch_horizon)
        self.state_reset_frac = float(state_reset_frac)
        self.archive: list[Archived] = []
        # snapshot times of the first collection are drawn below this: within the branch it will run
        self.prev_len = min(self.max_steps or 50, 50, self.horizon)
        self._snap_at = np.full(vec.num_envs, -1, dtype=np.int64)
        self._new_archive: list[Archived] = []

    def _check_mode(self, mode: GroupMode) -> None:
        if not mode.snapshots:
            raise UserInputError(
                f"algo.group_mode={mode.name} does not branch from snapshots: collect it with "
                "grpo_marl.collectors.EpisodeCollector (grpo_marl.collectors.episode_collector picks it)"
            )

    # -- the hooks of EpisodeCollector -------------------------------------------------------------
    def _start(self) -> tuple[Step, np.ndarray, np.ndarray, np.ndarray]:
        """Reset every env, then restore archived snapshots into most groups (each into all of a
        group's members), and draw each group leader's snapshot time of this collection."""
        step, t0, ret0, known = super()._start()
        g = self.group_size
        if self.archive:
            n_restore = int(round(self.num_groups * (1.0 - self.state_reset_frac)))
            picks = self.rng.integers(0, len(self.archive), size=n_restore)
            idx: list[int] = []
            snaps: list[Any] = []
            for grp, k in zip(range(n_restore), picks, strict=True):
                item = self.archive[int(k)]
                members = np.arange(grp * g, (grp + 1) * g)
                idx.extend(members.tolist())
                snaps.extend([item.snap] * g)
                for e in members:
                    step.put([int(e)], item.step)
                t0[members] = item.t
                prefix = getattr(item, "ret", None)
                if prefix is None:
                    known[members] = False
                else:
                    ret0[members] = prefix
            self.vec.restore(idx, snaps)
        # a uniform visited step of the previous collection (never 0: a reset gives that)
        self._snap_at = np.full(self.vec.num_envs, -1, dtype=np.int64)
        self._snap_at[::g] = self.rng.integers(1, max(2, self.prev_len), size=self.num_groups)
        self._new_archive = []
        return step, t0, ret0, known

    def _visit(self, t: int, step: Step, st: Storage, t0: np.ndarray, ret0: np.ndarray, known: np.ndarray) -> None:
        """Snapshot the envs whose snapshot time is ``t`` (and are still running)."""
        due_now = self._snap_at == t
        if not due_now.any():
            return
        due = np.flatnonzero(due_now & ~step.env_done.cpu().numpy())
        if not len(due):
            return
        for e, snap in zip(due, self.vec.snapshot(due.tolist()), strict=True):
            # the episode's return so far: before this branch + this branch's first t steps
            ret = None
            if known[e]:
                ret = ret0[e] + (st.rewards[:t, e] * st.alive[:t, e]).sum(0).cpu().numpy().astype(np.float64)
            self._new_archive.append(Archived(snap, int(t0[e] + t), step.rows([int(e)]), ret))

    def _finish(self, t: int) -> None:
        # Only states of this collection: when every group branched late and none lived to its
        # snapshot time, the archive empties and the next collection starts from resets (keeping
        # the old archive would replay its last state, one step from the end, forever).
        self.archive = self._new_archive
        self._new_archive = []
        self.prev_len = t

    def _extra_metrics(self, t0: np.ndarray) -> dict[str, float]:
        return {
            "rollout/frac_restored_groups": float((t0[:: self.group_size] > 0).mean()),
            "rollout/branch_start_mean": float(t0.mean()),
        }

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "archive": self.archive, "prev_len": self.prev_len}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.archive = list(state["archive"])
        self.prev_len = int(state["prev_len"])
