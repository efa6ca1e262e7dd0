"""Config values written as Hydra command-line overrides, and a user's own config file read as them.

Two ways in reach the config besides the command line: ``fit(**overrides)`` and a user's config file
(``--config-dir D --config-name exp``). Both must win over an env's tuned defaults exactly as
command-line keys do, and :func:`grpo_marl.config.resolve_config` knows the user's keys from the
override list alone. So ``fit``'s keywords become real overrides (:func:`overrides_from_mapping`),
and a config file is named by the overrides it stands for (:func:`file_overrides`), placed before
the command line's own (which therefore win over the file, as in Hydra).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from grpo_marl.errors import ConfigError, UserInputError

__all__ = ["file_overrides", "hydra_value", "overrides_from_mapping", "user_config_file"]

_HYDRA_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
#: The name a user's config file gives grpo_marl's own config in its defaults list.
BASE_CONFIG = "config"


class _NotExpressible(Exception):
    """A value Hydra's override grammar cannot write (set on the composed config instead)."""


def hydra_value(value: Any) -> str:
    """``value`` written in Hydra's override grammar so that Hydra reads back the same value and type.

    Strings are quoted whenever Hydra would read them differently (``"true"``, ``"3"``, a path with
    a comma, a ``module:function``); lists and dicts are written element by element. A dict whose
    keys Hydra's grammar cannot hold (``{"mypkg.rewards:f": 1.0}``) raises :class:`_NotExpressible`.
    """
    from grpo_marl.rundir import hydra_quote

    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return "nan" if f != f else ("inf" if f == float("inf") else "-inf" if f == -float("inf") else repr(f))
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        return hydra_quote(value)
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) and _HYDRA_KEY.fullmatch(k) for k in value):
            raise _NotExpressible
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    raise UserInputError(
        f"cannot pass {type(value).__name__} {value!r} as a config value: use str, int, float, bool, None, "
        "or lists/dicts of them"
    )


def overrides_from_mapping(overrides: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Config keys and values as Hydra overrides, and the values to set after composing.

    ``{"algo": "ppo", "algo.lr": 1e-3, "vec": {"num_envs": 8}, "env_kwargs": {"size": 3}}`` ->
    ``["algo=ppo", "algo.lr=0.001", "vec.num_envs=8", "++env_kwargs.size=3"]``: dicts are walked
    down to their leaves, as a user writes dotted keys on the command line, so they merge into a
    section instead of replacing it; ``a__b`` stands for ``a.b``. Keys of a free-form section
    (``env_kwargs``, ``marl.groups``) get Hydra's ``++`` (add or override). A leaf dict whose keys
    Hydra cannot write (``{"mypkg.rewards:f": 1.0}``) is returned in the second value, to set on the
    composed config; its key is still named in the list (``++key={}``) so it counts as set by the
    user and wins over the env's tuned defaults exactly like a command-line key.
    """
    from grpo_marl.config import FREE_FORM

    out: list[str] = []
    late: dict[str, Any] = {}

    def free(key: str) -> bool:
        return any(key == f or key.startswith(f + ".") for f in FREE_FORM)

    def add(key: str, value: Any) -> None:
        walk = isinstance(value, Mapping) and value
        if walk and all(isinstance(k, str) and _HYDRA_KEY.fullmatch(k) for k in value):
            for k, v in value.items():
                add(f"{key}.{k}", v)
            return
        prefix = "++" if free(key) else ""
        try:
            out.append(f"{prefix}{key}={hydra_value(value)}")
        except _NotExpressible:
            out.append(f"++{key}={{}}")
            late[key] = value

    for key, value in overrides.items():
        add(key.replace("__", "."), value)
    return out, late


# -- a user's own config file ------------------------------------------------------------------------
_FLAGS = {
    "--config-dir": "dir",
    "-cd": "dir",
    "--config-name": "name",
    "-cn": "name",
    "--config-path": "path",
    "-cp": "path",
}


def config_flags(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """Hydra's ``--config-dir/-cd``, ``--config-name/-cn`` and ``--config-path/-cp`` values in
    ``args``, and the arguments without them."""
    flags: dict[str, str] = {}
    rest: list[str] = []
    it = iter(args)
    for arg in it:
        name, eq, value = arg.partition("=")
        if name in _FLAGS:
            flags[_FLAGS[name]] = value if eq else next(it, "")
        else:
            rest.append(arg)
    return flags, rest


def user_config_file(args: list[str], conf_dir: Path) -> Path | None:
    """The user's config file the command line names (``--config-dir D --config-name exp``), or
    None when it runs grpo_marl's own ``config``. Raises :class:`ConfigError` when it names one that
    does not exist, or a file in ``--config-path`` (relative to grpo_marl's package: use
    ``--config-dir``)."""
    flags, _ = config_flags(args)
    if "path" in flags:
        raise ConfigError(
            f"--config-path {flags['path']}: Hydra resolves it inside grpo_marl's package; give your "
            "own config directory with --config-dir DIR --config-name NAME"
        )
    name = flags.get("name", BASE_CONFIG)
    if name == BASE_CONFIG and "dir" not in flags:
        return None
    stem = name[:-5] if name.endswith(".yaml") else name
    dirs = [Path(flags["dir"]).expanduser()] if "dir" in flags else []
    for d in [*dirs, conf_dir]:
        if (d / f"{stem}.yaml").is_file():
            path = (d / f"{stem}.yaml").resolve()
            return None if path == (conf_dir / f"{BASE_CONFIG}.yaml").resolve() else path
    where = " or ".join(str(d) for d in dirs) or "grpo_marl's config directory (add --config-dir DIR)"
    raise ConfigError(f"--config-name {name}: no {stem}.yaml in {where}")


def _defaults_entries(data: Mapping[str, Any], path: Path) -> list[Any]:
    entries = data.get("defaults", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'defaults' must be a list (e.g. defaults: [config, _self_])")
    return entries


def file_overrides(path: Path) -> list[str]:
    """The command-line overrides ``path`` stands for: the config groups its defaults list selects
    (``- override algo: ppo`` -> ``algo=ppo``) and every key it sets, walked as :func:`fit` walks
    its keywords. Hydra composes the file itself; these only say which keys the user set, so that
    they win over the env's tuned defaults (precedence: config files < algo/env defaults < user
    file < command line). A file that does not build on grpo_marl's config is refused, naming the
    line to add."""
    from omegaconf import OmegaConf

    from grpo_marl.config import CONFIG_GROUPS

    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as exc:  # noqa: BLE001  (YAML syntax errors: name the file and Hydra's reason)
        raise ConfigError(f"{path} is not a valid YAML config: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: a config file is a mapping of keys to values")
    data: dict[str, Any] = {str(k): v for k, v in loaded.items()}
    entries = _defaults_entries(data, path)
    if not any(e in (BASE_CONFIG, f"/{BASE_CONFIG}") for e in entries):
        raise ConfigError(
            f"{path} does not build on grpo_marl's config, so every key it leaves out would be missing; "
            f"start it with:\n    defaults:\n      - {BASE_CONFIG}\n      - _self_\n"
            "(config groups go between them, e.g. '- override algo: ppo')"
        )
    out: list[str] = []
    for entry in entries:
        if isinstance(entry, dict):
            for group, option in entry.items():
                group = str(group).removeprefix("override ").strip().lstrip("/")
                if group in CONFIG_GROUPS:
                    out.append(f"{group}={option}")
    data.pop("defaults", None)
    data.pop("hydra", None)
    args, _ = overrides_from_mapping(data)  # keys Hydra cannot write are named as ++key={}
    return out + args
