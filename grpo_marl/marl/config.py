"""Validation of the ``marl`` config section (registered with grpo_marl.config's validators).

Imported by ``envs.multiagent`` so that it is in place whenever a multi-agent env is resolved.
Which algorithm trains which env kind, and the PPO family's own keys (``algo=ppo|ippo|mappo`` are
one PPO), are checked where they are defined: :mod:`grpo_marl.config` and :mod:`grpo_marl.algos.ppo`.
"""

from __future__ import annotations

from omegaconf import DictConfig

from grpo_marl.config import register_validator
from grpo_marl.families import family_of
from grpo_marl.groups import GROUP_MODES


@register_validator
def validate_marl(cfg: DictConfig) -> list[str]:
    """Errors in ``marl.*`` and in multi-agent uses of ``algo.group_mode``."""
    if not family_of(cfg).multi_agent:
        return []
    errors: list[str] = []
    m = cfg.get("marl") or {}
    share = m.get("share", "group")
    if share not in ("group", "agent"):
        errors.append(f"marl.share={share!r} is not valid; choose group (shared per agent-group) or agent")
    workers = m.get("num_workers", -1)
    if not isinstance(workers, int) or workers < -1:
        errors.append(f"marl.num_workers={workers!r} must be -1 (auto), 0 (in-process) or a positive integer")
    groups = m.get("groups")
    if groups is not None and not hasattr(groups, "items"):
        errors.append(
            f"marl.groups={groups!r} must be a mapping: agent -> group ({{agent_0: red}}) or "
            "group -> list of agents/patterns ({red: [agent_0, agent_1]})"
        )
    a = cfg.algo
    mode = a.get("group_mode")
    if a.name == "grpo" and mode not in GROUP_MODES:
        errors.append(f"algo.group_mode={mode!r} is not valid for multi-agent envs; choose one of {GROUP_MODES}")
    return errors
