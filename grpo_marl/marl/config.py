"""Validation of the ``marl`` config section (registered with grpo_marl.config's validators).

Imported by ``envs.multiagent`` so that it is in place whenever a multi-agent env is resolved.
"""

from __future__ import annotations

from omegaconf import DictConfig

from grpo_marl.config import register_validator

MULTI_AGENT_MODES = ("seed", "state", "agent", "seed_agent")


@register_validator
def validate_marl(cfg: DictConfig) -> list[str]:
    """Errors in ``marl.*`` and in multi-agent uses of ``algo.group_mode``."""
    if cfg.get("env_kind") != "pettingzoo":
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
    if a.name == "grpo" and mode not in MULTI_AGENT_MODES:
        errors.append(f"algo.group_mode={mode!r} is not valid for multi-agent envs; choose one of {MULTI_AGENT_MODES}")
    if a.name == "ppo":
        errors.append("algo=ppo is the single-agent baseline; multi-agent envs use algo=mappo or algo=ippo")
    if a.name in ("ippo", "mappo"):
        for key in ("n_envs", "epochs", "minibatches"):
            value = a.get(key)
            if not isinstance(value, int) or value < 1:
                errors.append(f"algo.{key}={value!r} must be a positive integer")
        for key in ("gamma", "gae_lambda"):
            value = a.get(key)
            if not isinstance(value, (int, float)) or not 0 <= value <= 1:
                errors.append(f"algo.{key}={value!r} must be in [0, 1]")
        for key in ("lr", "clip_eps"):
            value = a.get(key)
            if not isinstance(value, (int, float)) or value <= 0:
                errors.append(f"algo.{key}={value!r} must be > 0")
    return errors
