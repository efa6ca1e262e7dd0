"""Plumbing shared by Tasks that own a training vector env, an eval vector env and a collector."""

from __future__ import annotations

from typing import Any


class CollectorTask:
    """Resume state is the collector's (RNG, archives, step counters); closing frees both envs."""

    vec: Any
    collector: Any
    _eval_vec: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {"collector": self.collector.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.collector.load_state_dict(state["collector"])

    def close(self) -> None:
        self.vec.close()
        if self._eval_vec is not None:
            self._eval_vec.close()
