"""Environments shipped with grpo_marl and their registration (imported lazily by the registry)."""
