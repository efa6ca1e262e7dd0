"""Every package the code imports is declared: by the base install, or by the extra of its feature.

The test walks the imports of ``grpo_marl/``, ``envs/`` and ``benchmarks/`` (lazy ones inside
functions included) with :mod:`ast`, so a new ``import x`` in a feature's code fails here until
``pyproject.toml`` declares ``x`` where a user of that feature gets it. A new user's machine has
nothing but what the extras install: a package present only on the developer's machine would
otherwise pass every test and fail for them.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="Python 3.10 reads pyproject.toml with tomli: pip install tomli")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FIRST_PARTY = {"grpo_marl", "envs", "benchmarks", "tests"}

#: top-level module -> the distribution that provides it
DISTRIBUTION = {
    "torch": "torch",
    "numpy": "numpy",
    "gymnasium": "gymnasium",
    "pettingzoo": "pettingzoo",
    "mpe2": "mpe2",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "tensorboard": "tensorboard",
    "tqdm": "tqdm",
    "yaml": "pyyaml",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "gguf": "gguf",
    "accelerate": "accelerate",
    "peft": "peft",
    "PIL": "pillow",
    "matplotlib": "matplotlib",
    "stable_baselines3": "stable-baselines3",
    "trl": "trl",
    "datasets": "datasets",
    "supersuit": "supersuit",
    "pymunk": "pymunk",
    "Box2D": "box2d",
    "pygame": "pygame-ce",
    "scipy": "scipy",
    "vmas": "vmas",
}
#: scripts run by a peer's own virtualenv (benchmarks/peer_venv.py), never by the project's
PEER_FILES = {"benchmarks/benchmarl_runner.py"}
#: distributions that a declared one always installs (imported by name, never pinned by us)
TRANSITIVE = {"huggingface-hub": "transformers"}
#: module -> the distribution providing it when it is not in DISTRIBUTION
TRANSITIVE_MODULES = {"huggingface_hub": "huggingface-hub"}

#: which extra a file's imports belong to (first match); files not matched are the base install
FEATURE_OF_FILE = [
    ("benchmarks/", "bench"),
    ("grpo_marl/evaluate.py", "video"),
    ("grpo_marl/marl/preprocess.py", "marl-extra"),
    ("grpo_marl/text/", "text"),
    ("grpo_marl/tasks/text.py", "text"),
    ("grpo_marl/tiny_lm.py", "text"),
    ("grpo_marl/policies/llm.py", "text"),
    ("grpo_marl/policies/fast_gpt2.py", "text"),
    ("envs/text/", "text"),
    ("envs/vmas/", "vmas"),
]
#: modules whose import is the feature of a specific option, not of the whole file
FEATURE_OF_MODULE = {"peft": "lora", "PIL": "video", "supersuit": "marl-extra"}
#: packages a feature needs at run time although no file of ours imports them by name
RUNTIME_NEEDS = {
    "text": ["accelerate", "gguf"],  # transformers' GGUF loader imports both
    "marl-extra": ["pymunk", "Box2D", "pygame", "supersuit"],  # PettingZoo's butterfly/sisl envs
    "box2d": ["Box2D", "pygame"],  # gymnasium.envs.box2d imports both (registry.GYM_FAMILY_INSTALL)
}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def declared(extra: str | None) -> set[str]:
    """Distributions a user gets from ``pip install -e .`` (+ ``extra``)."""
    names = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    if extra is not None:
        names |= {_name(r) for r in PYPROJECT["project"]["optional-dependencies"][extra]}
    return names | {dist for dist, via in TRANSITIVE.items() if via in names}


def imports() -> list[tuple[str, str]]:
    """(file relative to the repo, top-level module) for every import statement of the code."""
    found = []
    for folder in ("grpo_marl", "envs", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            rel = path.relative_to(ROOT).as_posix()
            if rel in PEER_FILES:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found += [(rel, alias.name.split(".")[0]) for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.append((rel, node.module.split(".")[0]))
    return found


def feature(rel: str, module: str) -> str | None:
    if module in FEATURE_OF_MODULE:
        return FEATURE_OF_MODULE[module]
    return next((extra for prefix, extra in FEATURE_OF_FILE if rel.startswith(prefix)), None)


def third_party() -> list[tuple[str, str]]:
    return [
        (rel, module)
        for rel, module in imports()
        if module not in sys.stdlib_module_names and module not in FIRST_PARTY and module != "__future__"
    ]


def test_the_walk_sees_lazy_imports() -> None:
    """The walk reaches imports inside functions (the lazy ones are the point)."""
    found = set(imports())
    assert ("grpo_marl/policies/llm.py", "peft") in found
    assert ("grpo_marl/evaluate.py", "PIL") in found
    assert ("benchmarks/trl_runner.py", "datasets") in found


def test_every_imported_module_has_a_known_distribution() -> None:
    unknown = sorted({f"{rel}: import {m}" for rel, m in third_party() if m not in DISTRIBUTION | TRANSITIVE_MODULES})
    assert not unknown, "add these modules to DISTRIBUTION (and their package to an extra):\n" + "\n".join(unknown)


@pytest.mark.parametrize("extra", [None, *sorted(PYPROJECT["project"]["optional-dependencies"])])
def test_each_feature_declares_what_its_code_imports(extra: str | None) -> None:
    have = declared(extra)
    missing = sorted(
        {
            f"{rel}: import {module} (needs {dist})"
            for rel, module in third_party()
            if feature(rel, module) == extra
            for dist in [DISTRIBUTION.get(module) or TRANSITIVE_MODULES[module]]
            if dist not in have
        }
    )
    where = f"[project.optional-dependencies] {extra}" if extra else "[project] dependencies"
    assert not missing, f"pyproject.toml {where} must declare:\n" + "\n".join(missing)


@pytest.mark.parametrize("extra", sorted(RUNTIME_NEEDS))
def test_each_feature_declares_its_runtime_needs(extra: str) -> None:
    have = declared(extra)
    assert not [m for m in RUNTIME_NEEDS[extra] if DISTRIBUTION[m] not in have]


def test_bench_covers_every_suite() -> None:
    """``.[bench]`` runs every suite: it includes what the text and marl_extra suites train on."""
    have = declared("bench")
    for extra in ("text", "marl-extra"):
        assert declared(extra) <= have, f"bench lacks {sorted(declared(extra) - have)} of {extra}"


def test_video_is_pillow_only() -> None:
    assert {_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["video"]} == {"pillow"}
