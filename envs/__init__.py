"""Environments shipped with grpo_marl and their registration (imported lazily by the registry).

Their tuned config defaults are data, one YAML file per env in ``envs/conf/`` (sections ``common``
and one per algorithm; :func:`grpo_marl.registry.load_defaults`), so tuning never edits code.
"""

from pathlib import Path

#: The tuned-defaults files of the shipped envs.
CONF_DIR = Path(__file__).parent / "conf"
