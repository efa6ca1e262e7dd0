"""Config composition and validation: bad values fail before anything is built, naming the key and
what to change; env defaults sit between the base files and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

from grpo_marl.config import ConfigError, env_defaults
from grpo_marl.registry import UnknownEnvError, get_spec, register_env

pytestmark = pytest.mark.usefixtures("single_thread")


def error_of(resolve, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(overrides)
    return str(info.value)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("algo.group_size=1", ["algo.group_size=1", "at least 2", "algo.group_size=8"]),
        ("algo.group_size=0", ["algo.group_size=0", "at least 2"]),
        ("algo.lr=0", ["algo.lr=0", "> 0"]),
        ("algo.lr=-0.001", ["algo.lr=-0.001", "> 0"]),
        ("algo.num_groups=0", ["algo.num_groups=0", "> 0"]),
        ("algo.epochs=1.5", ["algo.epochs=1.5", "integer"]),
        ("algo.clip_eps_low=1.0", ["algo.clip_eps_low=1.0", "< 1"]),
        ("algo.gamma=1.5", ["algo.gamma=1.5", "[0, 1]"]),
        ("total_steps=0", ["total_steps=0", "> 0"]),
        ("eval.episodes=0", ["eval.episodes=0", "> 0"]),
        ("algo.beta=-1", ["algo.beta=-1", ">= 0"]),
    ],
)
def test_bad_values_name_key_and_fix(resolve, override: str, expected: list[str]) -> None:
    message = error_of(resolve, ["env=cartpole", override])
    for part in expected:
        assert part in message, message


@pytest.mark.parametrize(
    "override, options",
    [
        ("algo.advantage=gae", "outcome, rtg"),
        ("algo.scale=global", "group, batch, none"),
        ("algo.zero_std=drop", "keep, skip, resample"),
        ("algo.lr_schedule=step", "constant, linear, cosine"),
        ("algo.group_mode=episode", "seed, state"),
        ("algo.aggregation=sum", "dapo"),
        ("algo.loss=ppo_clip", "grpo"),
        ("vec.vectorization=threads", "auto, native, sync, async"),
        ("device=tpu", "auto, cpu, cuda"),
    ],
)
def test_bad_choices_list_the_options(resolve, override: str, options: str) -> None:
    key = override.split("=")[0]
    message = error_of(resolve, ["env=cartpole", override])
    assert key in message and options in message, message


def test_all_problems_reported_at_once(resolve) -> None:
    message = error_of(resolve, ["env=cartpole", "algo.group_size=1", "algo.lr=0", "algo.scale=x"])
    assert "algo.group_size" in message and "algo.lr" in message and "algo.scale" in message


def test_multi_agent_group_mode_on_single_agent_env(resolve) -> None:
    message = error_of(resolve, ["env=cartpole", "algo.group_mode=agent"])
    assert "algo.group_mode=agent" in message and "seed or state" in message


def test_state_groups_need_snapshots(resolve) -> None:
    message = error_of(resolve, ["env=pendulum", "algo.group_mode=state", "vec.vectorization=async"])
    assert "vec.vectorization=sync" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_cuda(resolve, device: str) -> None:
    message = error_of(resolve, ["env=cartpole", f"device={device}"])
    assert f"device={device}" in message and "device=cpu" in message and "CUDA is not available" in message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_accepted_when_present(resolve) -> None:
    assert resolve(["env=cartpole", "device=cuda"]).device == "cuda"


def test_unknown_key_fails_in_composition(compose) -> None:
    with pytest.raises(ConfigCompositionException, match="grup_size"):
        compose(["env=cartpole", "algo.grup_size=8"])


def test_unknown_env_lists_known(resolve) -> None:
    with pytest.raises(UnknownEnvError, match="cartpole"):
        resolve(["env=cartpol"])


# --------------------------------------------------------------------------- env defaults merge
def test_env_default_beats_base_file(compose, resolve) -> None:
    base = compose(["env=cartpole"])
    cfg = resolve(["env=cartpole"])
    tuned = get_spec("cartpole").defaults
    assert base.algo.lr != tuned["grpo"]["algo"]["lr"]  # the test means something
    assert cfg.algo.lr == tuned["grpo"]["algo"]["lr"]
    assert cfg.total_steps == tuned["common"]["total_steps"]
    assert cfg.eval.every_steps == tuned["common"]["eval"]["every_steps"]
    assert cfg.train.threshold == 475.0  # from the registry
    assert cfg.vec.num_envs == cfg.algo.num_groups * cfg.algo.group_size  # derived
    assert cfg.env_kind == "gymnasium"


@pytest.mark.parametrize("lr", ["0.01", "0.0003"])
def test_override_beats_env_default(compose, resolve, lr: str) -> None:
    """Including an override equal to the *base* file's value (0.0003): the user said it."""
    assert compose(["env=cartpole"]).algo.lr == 0.0003
    cfg = resolve(["env=cartpole", f"algo.lr={lr}", "total_steps=1234", "eval.every_steps=0"])
    assert cfg.algo.lr == float(lr)
    assert cfg.total_steps == 1234
    assert cfg.eval.every_steps == 0
    assert cfg.algo.epochs == get_spec("cartpole").defaults["grpo"]["algo"]["epochs"]


def test_override_of_threshold_and_num_envs(resolve) -> None:
    cfg = resolve(["env=cartpole", "train.threshold=100", "algo.num_groups=2", "algo.group_size=3"])
    assert cfg.train.threshold == 100
    assert cfg.vec.num_envs == 6


def test_python_registered_defaults(registry_sandbox, resolve) -> None:
    register_env("flat_defaults_env", gym_id="CartPole-v1", defaults={"algo": {"group_size": 4}, "total_steps": 777})
    cfg = resolve(["env=flat_defaults_env"])
    assert cfg.algo.group_size == 4 and cfg.total_steps == 777
    cfg = resolve(["env=flat_defaults_env", "algo.group_size=6"])
    assert cfg.algo.group_size == 6 and cfg.total_steps == 777


def test_per_algo_sections(registry_sandbox) -> None:
    spec = register_env(
        "sectioned_env",
        gym_id="CartPole-v1",
        defaults={"common": {"total_steps": 5}, "grpo": {"algo": {"lr": 0.5}}, "ppo": {"algo": {"lr": 0.1}}},
    )
    assert env_defaults(spec, "grpo") == {"total_steps": 5, "algo": {"lr": 0.5}}
    assert env_defaults(spec, "ppo") == {"total_steps": 5, "algo": {"lr": 0.1}}


def test_module_factory_defaults_apply(resolve) -> None:
    cfg = resolve(["env=tests.custom_envs:make_toy"])
    assert (cfg.algo.group_size, cfg.algo.num_groups, cfg.vec.num_envs) == (4, 3, 12)
    assert cfg.train.threshold == 123.0


def test_invalid_env_defaults_are_reported(registry_sandbox, resolve) -> None:
    register_env("bad_defaults_env", gym_id="CartPole-v1", defaults={"algo": {"group_sise": 4}})
    message = error_of(resolve, ["env=bad_defaults_env"])
    assert "bad_defaults_env" in message and "group_sise" in message


def test_env_defaults_are_validated_too(registry_sandbox, resolve) -> None:
    register_env("tiny_group_env", gym_id="CartPole-v1", defaults={"algo": {"group_size": 1}})
    assert "algo.group_size=1" in error_of(resolve, ["env=tiny_group_env"])
    assert resolve(["env=tiny_group_env", "algo.group_size=2"]).algo.group_size == 2


# --------------------------------------------------------------------------- through the CLI
def test_cli_typo_exits_nonzero_naming_the_key(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "typo"
    proc = run_cli("env=cartpole", "algo.grup_size=8", run_dir=run_dir, check=False)
    assert proc.returncode != 0
    assert "grup_size" in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists()


def test_cli_invalid_value_fails_before_training(run_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "invalid"
    proc = run_cli("env=cartpole", "algo.group_size=1", "algo.lr=0", run_dir=run_dir, check=False)
    assert proc.returncode == 2
    assert "algo.group_size=1" in proc.stderr and "algo.lr=0" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()


def test_added_unknown_key_is_rejected_with_a_suggestion(run_cli):
    """Hydra's own hint for a typo is `+key=...`; following it must not silently add a dead key."""
    proc = run_cli("env=cartpole", "+algo.grup_size=3", "total_steps=100", check=False)
    assert proc.returncode == 2
    assert "unknown key algo.grup_size" in proc.stderr
    assert "did you mean algo.group_size" in proc.stderr


# --------------------------------------------------------------------------- the settings
ALGOS = ("grpo", "ppo", "mappo", "ippo")


def _declared_kinds() -> dict[str, str]:
    from grpo_marl import settings

    return {k: spec.kind for algo in ("grpo", "ppo") for k, (spec, _, _) in settings.declared(algo).items()}


def _leaf_keys(node: object, prefix: str = "") -> list[str]:
    from omegaconf import DictConfig

    kinds = _declared_kinds()
    out = []
    for key, value in node.items():  # type: ignore[attr-defined]
        full = f"{prefix}{key}"
        if isinstance(value, (dict, DictConfig)) and value and kinds.get(full) != "map":
            out.extend(_leaf_keys(value, f"{full}."))
        else:
            out.append(full)
    return out


def _file_keys(env_files: bool = True) -> list[tuple[str, str, object]]:
    """``(algo, dotted key, value)`` of every key set in grpo_marl/conf (and envs/conf)."""
    from omegaconf import OmegaConf

    from grpo_marl.registry import load_defaults

    root = Path(__file__).resolve().parents[1]
    conf = root / "grpo_marl" / "conf"
    out: list[tuple[str, str, object]] = []

    def add(algo: str, data: dict, prefix: str = "") -> None:
        data = {k: v for k, v in data.items() if k not in ("defaults", "hydra")}
        for key in _leaf_keys(data):
            out.append((algo, prefix + key, OmegaConf.select(OmegaConf.create(data), key)))

    add("grpo", OmegaConf.to_container(OmegaConf.load(conf / "config.yaml")))
    for path in sorted((conf / "algo").glob("*.yaml")):
        add(path.stem, OmegaConf.to_container(OmegaConf.load(path)), "algo.")
    for group in ("model", "text"):
        for path in sorted((conf / group).glob("*.yaml")):
            add("grpo", OmegaConf.to_container(OmegaConf.load(path)), f"{group}.")
    paths = sorted((root / "envs" / "conf").glob("*.yaml")) if env_files else []
    assert paths or not env_files
    for path in paths:
        for section, overrides in load_defaults(path).items():
            add(section if section in ALGOS else "grpo", overrides)
    return out


def test_every_key_of_every_config_file_is_declared() -> None:
    """A key cannot be added to a config file without a type, a default and help (grpo_marl/settings.py)."""
    from grpo_marl import settings

    checked = _file_keys()
    missing = sorted({f"{key} (algo={algo})" for algo, key, _ in checked if key not in settings.declared(algo)})
    assert not missing, f"declare these keys in grpo_marl/settings.py: {missing}"
    assert len(checked) > 40


def test_config_files_keep_only_what_differs_from_the_defaults() -> None:
    """One default per key: a YAML file of grpo_marl/conf that repeats a dataclass default is a second one."""
    from grpo_marl import settings

    checked = _file_keys(env_files=False)
    assert {k for _, k, _ in checked} >= {"algo.name", "algo.critic_state"}
    same = [f"{k} (algo={a})" for a, k, v in checked if settings.declared(a)[k][2] == v]
    assert not same, f"these keys repeat their dataclass default: {same}"


def test_every_field_has_help_and_a_default() -> None:
    from omegaconf import MISSING

    from grpo_marl import settings

    for algo in ("grpo", "ppo"):
        for key, (_, help_, default) in settings.declared(algo).items():
            assert help_ and "\n" not in help_, key
            assert default != MISSING, key


def test_config_reference_is_up_to_date() -> None:
    """docs/CONFIG.md is generated from the settings: regenerate it with
    ``python -m grpo_marl.train --help-config > docs/CONFIG.md``."""
    from grpo_marl import settings

    doc = Path(__file__).resolve().parents[1] / "docs" / "CONFIG.md"
    assert doc.read_text() == settings.reference_markdown(), "regenerate docs/CONFIG.md (see this test's docstring)"


def test_help_config_prints_the_reference(capsys) -> None:
    from grpo_marl import settings
    from grpo_marl.train import main

    main(["--help-config"])
    assert capsys.readouterr().out == settings.reference_markdown()


@pytest.mark.parametrize(
    "args, line",
    [
        (["env=cartpole", "algo.epochs=1.5"], "algo.epochs=1.5 must be an integer"),
        (["env=simple_spread", "algo=mappo", "algo.critic_time=maybe"], "algo.critic_time=maybe must be true or false"),
    ],
)
def test_type_errors_exit_2_through_the_cli(args: list[str], line: str, tmp_path: Path, capsys) -> None:
    """Refused while Hydra composes (the field's type), with validation's one-line message."""
    code, err = _cli_error(args, tmp_path, capsys)
    assert code == 2 and err == f"error: invalid configuration:\n  - {line}\n", err


def test_rules_skip_a_section_whose_values_are_refused(resolve) -> None:
    """``vec.num_envs=-1`` is refused once: GRPO's rule on ``vec.num_envs`` (it reads ``vec``) is
    not asked about a value already refused."""
    message = error_of(resolve, ["env=cartpole", "vec.num_envs=-1"])
    assert message == (
        "invalid configuration:\n  - vec.num_envs=-1 must be >= 0 (0 = derived from the algorithm's batch)"
    )


def test_user_registered_choices_validate(resolve) -> None:
    """``algo.aggregation`` reads the registry when the config is checked: a user's entry is a choice."""
    from grpo_marl.losses import AGGREGATIONS

    message = error_of(resolve, ["env=cartpole", "algo.aggregation=mine_for_test"])
    assert "algo.aggregation=mine_for_test is not valid; choose one of" in message
    AGGREGATIONS.register("mine_for_test", AGGREGATIONS["dapo"])
    try:
        assert resolve(["env=cartpole", "algo.aggregation=mine_for_test"]).algo.aggregation == "mine_for_test"
    finally:
        AGGREGATIONS.pop("mine_for_test")


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.epochs=1.5", "algo.epochs=1.5 must be an integer"),
        ("log.progress=maybe", "log.progress=maybe must be true or false"),
        ("env_kwargs=3", "env_kwargs=3 must be a mapping ({key: value})"),
        ("policy.hidden=[a]", "policy.hidden=a must be a list of positive integers, e.g. [64, 64]"),
    ],
)
def test_type_errors_at_composition_are_one_line(compose, override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose(["env=cartpole", override])
    assert str(info.value) == "invalid configuration:\n  - " + message


def _bad_value(key: str, spec) -> str | None:
    """A value of the wrong type or outside the declared range, as a command-line string."""
    if key in ("env", "env_kwargs") or spec.kind == "any":
        return None  # env names have their own tests; free-form
    if key == "resume":
        return "/nonexistent/run"
    if key == "device":
        return "tpu"
    if spec.choices is not None:
        return "not_an_option"
    if spec.kind == "bool":
        return "maybe"
    if spec.kind == "str":
        return "nope" if key == "algo.name" else "''"
    if spec.kind == "ints":
        return "[0]"
    if spec.kind == "map":
        return "3"
    for bound, delta in ((spec.gt, 0), (spec.lo, -1), (spec.lt, 0), (spec.hi, 1)):
        if bound is not None:
            value = bound + delta
            return str(int(value)) if spec.kind == "int" else str(value)
    return "abc"


KEY_TOKEN = r"(?<![\w.+/-])((?:[a-z_][a-z0-9_]*\.)*[a-z_][a-z0-9_]*)="


def _named_keys(text: str) -> set[str]:
    import re

    return set(re.findall(KEY_TOKEN, text))


def _exists(key: str) -> bool:
    from omegaconf import DictConfig, OmegaConf

    from grpo_marl.config import CONFIG_GROUPS, FREE_FORM, reference_config

    if key in CONFIG_GROUPS or any(key.startswith(f + ".") for f in FREE_FORM):
        return True
    for algo in ALGOS:
        ref = reference_config(algo)
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(ref, parent) if parent else ref
        if isinstance(node, DictConfig) and leaf in node:
            return True
    return False


def _bad_value_table() -> list[tuple[str, str, str]]:
    from grpo_marl import settings

    rows = []
    for algo in ("grpo", "ppo"):
        for key, (spec, _, _) in settings.declared(algo).items():
            if algo != "grpo" and not key.startswith("algo."):
                continue
            bad = _bad_value(key, spec)
            if bad is not None and _exists(key):  # keys a helper declared ahead of its config file
                rows.append((algo, key, bad))
    return rows


BAD_VALUES = _bad_value_table()


def _input_error(algo: str, key: str, bad: str, run_dir: Path) -> str:
    """What ``python -m grpo_marl.train env=cartpole algo=ALGO KEY=BAD`` refuses with: the same
    composition and :func:`grpo_marl.train.run`, in-process (the table is long)."""
    from grpo_marl.errors import UserInputError
    from grpo_marl.train import run
    from tests.conftest import compose_config

    args = ["env=cartpole", f"algo={algo}", f"{key}={bad}", "log.progress=false"]
    with pytest.raises(UserInputError) as info:  # UserInputError: exit 2 (test_failures checks the mapping)
        run(compose_config(args), args, run_dir)  # a wrong type already fails in composition
    return str(info.value)


def _cli_error(args: list[str], tmp_path: Path, capsys) -> tuple[int, str]:
    """``python -m grpo_marl.train args`` in-process (the same main); its exit code and stderr."""
    from grpo_marl.train import main

    with pytest.raises(SystemExit) as info:
        main([*args, f"hydra.run.dir={tmp_path / 'run'}", "log.progress=false"])
    return int(info.value.code), capsys.readouterr().err


def test_bad_value_table_covers_every_key() -> None:
    covered = {key for _, key, _ in BAD_VALUES}
    assert {"algo.group_size", "algo.n_steps", "vec.max_steps", "threads", "policy.activation", "text.top_p"} <= covered
    assert len(covered) > 90


@pytest.mark.parametrize("algo, key, bad", BAD_VALUES, ids=[f"{a}:{k}" for a, k, _ in BAD_VALUES])
def test_every_key_refuses_a_bad_value(algo: str, key: str, bad: str, tmp_path: Path) -> None:
    message = _input_error(algo, key, bad, tmp_path / "run")
    assert f"{key}=" in message, message
    assert not (tmp_path / "run").exists()  # nothing built or written


@pytest.mark.parametrize("key, bad", [("vec.max_steps", "0"), ("threads", "-3"), ("policy.activation", "swish")])
def test_bad_value_exits_2_through_the_cli(key: str, bad: str, tmp_path: Path, capsys) -> None:
    code, err = _cli_error(["env=cartpole", f"{key}={bad}"], tmp_path, capsys)
    assert code == 2 and f"{key}={bad}" in err and "Traceback" not in err, err
    assert not (tmp_path / "run" / "config.yaml").exists()


CROSS_KEY = [
    (["env=cartpole", "algo=mappo"], "algo=mappo trains multi-agent PettingZoo envs and VMAS scenarios only"),
    (["env=cartpole", "algo=ippo"], "use algo=grpo or algo=ppo"),
    (["env=simple_spread", "algo=ppo"], "use algo=grpo or algo=mappo or algo=ippo"),
    (["env=cartpole", "vec.num_envs=10"], "vec.num_envs=10 does not fit algo.num_groups=8 x algo.group_size=8"),
    (["env=cartpole", "algo.group_mode=agent"], "algo.group_mode=agent needs a multi-agent env"),
    (["env=cartpole", "algo.rollout=stream", "vec.vectorization=async"], "use vec.vectorization=sync"),
    (["env=cartpole", "train.stop_on_threshold=true", "eval.every_steps=0"], "set eval.every_steps="),
    (["env=tests.custom_envs:bandit", "train.stop_on_threshold=true", "eval.every_steps=100"], "set train.threshold="),
    (
        ["env=cartpole", "train.stop_on_threshold=true", "total_steps=5000", "eval.every_steps=8000"],
        "train.stop_on_threshold=true but eval.every_steps=8000 is larger than total_steps=5000, so no evaluation "
        "runs before the end; set eval.every_steps<=total_steps (e.g. 500) or raise total_steps",
    ),
    (["env=cartpole", "algo.grup_size=8"], "unknown key algo.grup_size (did you mean algo.group_size?)"),
    (["env=cartpole", "+algo.grup_size=8"], "unknown key algo.grup_size (did you mean algo.group_size?)"),
    (["env=cartpole", "env_kwargs.foo=1"], "add env_kwargs.foo with a +, e.g. +env_kwargs.foo=1"),
    (["env=cartpole", "algo=ppx"], "algo=ppx is not a config option; choose one of grpo, ippo, mappo, ppo"),
]


@pytest.mark.parametrize("args, expected", CROSS_KEY, ids=[" ".join(a[1:]) for a, _ in CROSS_KEY])
def test_cross_key_rules(args: list[str], expected: str, tmp_path: Path, capsys) -> None:
    code, err = _cli_error(args, tmp_path, capsys)
    assert code == 2 and expected in err, err


def test_every_key_named_in_an_error_message_exists(tmp_path: Path, capsys) -> None:
    """Messages tell users which key to set: that key must exist (no ``env.max_steps``)."""
    messages = [_input_error(algo, key, bad, tmp_path / "run") for algo, key, bad in BAD_VALUES]
    for args, _ in CROSS_KEY:
        messages.append(_cli_error(args, tmp_path, capsys)[1])
    named = set().union(*(_named_keys(m) for m in messages)) - {"algo.grup_size", "env_kwargs.foo"}
    assert {"vec.num_envs", "algo.num_groups", "vec.vectorization", "eval.every_steps"} <= named
    assert not [k for k in named if not _exists(k)], messages


def test_every_key_named_in_the_source_exists() -> None:
    """The same for every string literal in the package that tells users to set a key."""
    import ast
    import re

    root = Path(__file__).resolve().parents[1]
    sections = "algo|vec|policy|eval|train|log|checkpoint|marl|model|text|distributed|env"
    dotted = rf"((?:{sections})\.[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)"
    patterns = [re.compile(rf"(?<![\w.]){dotted}="), re.compile(rf"\b(?:set|use|pass|lower|raise|leave) {dotted}")]
    found: dict[str, str] = {}
    for path in sorted([*root.glob("grpo_marl/**/*.py"), *root.glob("envs/**/*.py")]):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            else:
                continue
            for pattern in patterns:
                for match in pattern.finditer(text):
                    found.setdefault(match.group(1), f"{path.relative_to(root)}:{node.lineno}")
    assert len(found) > 20
    wrong = {key: where for key, where in found.items() if not _exists(key)}
    assert not wrong, f"messages name keys that do not exist: {wrong}"
