"""The config's types: one dataclass per section, one default and one line of help per key.

Each field is declared with a helper (:func:`Int`, :func:`Float`, :func:`Choice`, ...) that stores
its help and its :class:`Key` (type, range or choice set) in the field's metadata, so the default,
the documentation (``docs/CONFIG.md``, ``python -m grpo_marl.train --help-config``) and the check
of a value come from one place. The dataclasses are registered in Hydra's ConfigStore
(:func:`register_configs`, BenchMARL's pattern) and the YAML files of ``grpo_marl/conf`` build on
them (``defaults: [base_grpo, _self_]``), keeping only what differs.

OmegaConf types ``int``, ``bool`` and ``str`` fields, so a value of the wrong type already fails
while Hydra composes (:func:`grpo_marl.config.compose` turns that into the same one-line message).
Numbers are typed ``Any`` (:data:`Number`): a ``float`` field would rewrite ``algo.lr=0`` as
``0.0``, and messages quote the value the user wrote. :func:`check` walks the fields of every
section and checks ranges and choices (also of configs loaded without the types, e.g. a run's
saved ``config.yaml``); rules across keys are the ``errors`` classmethod of the section that owns
them, called by :func:`grpo_marl.config.validate`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

__all__ = [
    "GRPOSettings",
    "Key",
    "ModelSettings",
    "PPOSettings",
    "RunSettings",
    "Section",
    "TextSettings",
    "algo_settings",
    "check",
    "check_value",
    "declared",
    "int_or_none",
    "reference",
    "register_configs",
    "sections",
]

#: A number field: ``int`` or ``float`` as written (see the module docstring for why not ``float``).
Number = Any


@dataclass(frozen=True)
class Key:
    """A key's type and range: ``kind`` is int | float | bool | str | ints (list of ints) | map | any."""

    kind: str
    lo: float | None = None  # inclusive lower bound (``gt`` for exclusive)
    gt: float | None = None
    hi: float | None = None  # inclusive upper bound (``lt`` for exclusive)
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    nullable: bool = False
    hint: str = ""  # appended to a range error: what to set instead
    #: a choice among what a registry holds *at validation time* (so user registrations count)
    registered: Callable[[], tuple[Any, ...]] | None = None

    def options(self) -> tuple[Any, ...] | None:
        """The allowed values of a choice key (None: not a choice)."""
        return self.registered() if self.registered is not None else self.choices

    def describe(self) -> str:
        options = self.options()
        if options is not None:
            return "one of " + ", ".join(_show(c) for c in options)
        if self.kind == "ints":
            return "a list of positive integers, e.g. [64, 64]"
        bounds = [f"{sign} {_num(b)}" for b, sign in self._bounds() if b is not None]
        noun = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
        text = noun.get(self.kind, self.kind) + (" " + " and ".join(bounds) if bounds else "")
        return text + (" (or null)" if self.nullable else "")

    def _bounds(self) -> tuple[tuple[float | None, str], ...]:
        return ((self.gt, ">"), (self.lo, ">="), (self.lt, "<"), (self.hi, "<="))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- field helpers: a default, one line of help, the key's type and range ---------------------------
def _field(default: Any, help: str, key: Key) -> Any:
    metadata = {"help": help, "key": key}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def Int(default: int | None, help: str, *, lo: int | None = None, gt: int | None = None, hint: str = "") -> Any:
    return _field(default, help, Key("int", lo=lo, gt=gt, nullable=default is None, hint=hint))


def Float(
    default: float | None,
    help: str,
    *,
    lo: float | None = None,
    gt: float | None = None,
    hi: float | None = None,
    lt: float | None = None,
    hint: str = "",
) -> Any:
    return _field(default, help, Key("float", lo=lo, gt=gt, hi=hi, lt=lt, nullable=default is None, hint=hint))


def Bool(default: bool, help: str) -> Any:
    return _field(default, help, Key("bool"))


def Str(default: str | None, help: str) -> Any:
    return _field(default, help, Key("str", nullable=default is None))


def Choice(default: Any, help: str, *options: Any, nullable: bool = False) -> Any:
    return _field(default, help, Key("choice", choices=tuple(options), nullable=nullable))


def Registered(default: str, help: str, names: Callable[[], tuple[Any, ...]]) -> Any:
    """A choice among the names ``names()`` returns when the config is checked (a registry's)."""
    return _field(default, help, Key("choice", registered=names))


def Ints(default: list[int] | None, help: str, *, nullable: bool = False) -> Any:
    return _field(default, help, Key("ints", nullable=nullable or default is None))


def Map(default: dict[str, Any] | None, help: str, *, nullable: bool = False) -> Any:
    """A free-form mapping (its keys are the factory's or the user's, not declared here)."""
    return _field(default, help, Key("map", nullable=nullable or default is None))


def Free(default: Any, help: str) -> Any:
    """A value of several types (``auto | true | false``, a string or a list): see the help."""
    return _field(default, help, Key("any"))


def _section(cls: type, help: str) -> Any:
    return field(default_factory=cls, metadata={"help": help})


def _grpo_losses() -> tuple[str, ...]:
    from grpo_marl.losses import LOSSES, GRPOLoss

    return tuple(k for k in LOSSES.names() if issubclass(LOSSES[k], GRPOLoss))


def _aggregations() -> tuple[str, ...]:
    from grpo_marl.losses import AGGREGATIONS

    return tuple(AGGREGATIONS.names())


def _group_modes() -> tuple[str, ...]:
    from grpo_marl.groups import GROUP_MODES

    GROUP_MODES.names()  # loads the entry points
    return tuple(GROUP_MODES)  # in registration order: the built-ins first, as documented


def int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


SCHEDULES = ("constant", "linear", "cosine")


class Section:
    """Base of every section: its rules across keys, if any.

    :meth:`errors` gets the whole resolved config (``run``) and returns one message per problem.
    It runs only when the walker found no bad value in this section nor in the sections named by
    :attr:`reads` (a rule over a value of the wrong type would only repeat that error).
    """

    #: other sections (dotted prefixes) this section's rules read
    reads: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def errors(cls, run: DictConfig) -> list[str]:
        return []


# -- sections of conf/config.yaml --------------------------------------------------------------------
@dataclass
class DistributedSettings(Section):
    """torchrun data parallelism (``torchrun --nproc_per_node=N -m grpo_marl.train ...``); ignored otherwise."""

    backend: str = Choice(
        "auto",
        "process group: auto (gloo for CPU tensors + nccl for CUDA tensors) | gloo | nccl",
        "auto",
        "gloo",
        "nccl",
    )
    find_unused_parameters: Any = Choice(
        "auto",
        "DDP flag; auto = true for multi-agent policies (a minibatch may miss an agent-group)",
        "auto",
        True,
        False,
    )

    reads = ("algo", "vec")

    @classmethod
    def errors(cls, run: DictConfig) -> list[str]:
        """Under torchrun, the global batch must split evenly over the ranks."""
        from grpo_marl.distributed import env_world_size, split_keys

        world = env_world_size()
        if world <= 1:
            return []
        errors = []
        for key in split_keys(run):
            value = OmegaConf.select(run, key)
            if isinstance(value, int) and value > 0 and value % world:
                errors.append(
                    f"{key}={value} does not split over {world} torchrun ranks (each rank collects "
                    f"{key}/{world}); use a multiple of {world}"
                )
        return errors


@dataclass
class VecSettings(Section):
    """The vector env the collector steps."""

    num_envs: int = Int(
        0, "parallel envs; 0 = derived (GRPO: num_groups * group_size, PPO: algo.n_envs)", lo=0,
        hint="0 = derived from the algorithm's batch",
    )  # fmt: skip
    vectorization: str = Choice(
        "auto",
        "native (one numpy program over all envs: a batched port or the env's vector_factory) | sync (envs in this "
        "process) | async (worker processes); auto = native where it exists, else sync",
        "auto", "native", "sync", "async",
    )  # fmt: skip
    max_steps: int | None = Int(None, "cap on rollout length (null = the env's time limit)", gt=0,
                                   hint="null = the env's own time limit")  # fmt: skip


@dataclass
class PolicySettings(Section):
    """The MLP (or CNN-encoder) actor of control and multi-agent envs."""

    hidden: list[int] = Ints([64, 64], "MLP hidden sizes")
    activation: str = Choice("tanh", "MLP activation", "tanh", "relu", "elu", "gelu", "silu")
    log_std_init: Number = Float(0.0, "initial log std of the Gaussian policy (Box actions)")
    normalize_obs: bool = Bool(False, "running mean/std observation normalisation")
    encoder: str = Choice(
        "auto", "auto (cnn for image observations, else mlp) | mlp (flattens images) | cnn (Nature-CNN)",
        "auto", "mlp", "cnn",
    )  # fmt: skip


@dataclass
class EnvPreprocessSettings(Section):
    """SuperSuit preprocessing of PettingZoo observations (grpo_marl/marl/preprocess.py)."""

    color_reduction: str | None = Choice(
        None, "null | full (grayscale) | R | G | B", "full", "R", "G", "B", nullable=True
    )
    resize: list[int] | None = Ints(None, "null | [width, height]")
    frame_stack: int = Int(1, "stack the last N observations on the channel axis (1 = off)", gt=0)
    dtype: str | None = Choice(None, "null (images stay uint8) | uint8 | float32", "uint8", "float32", nullable=True)
    state_resize: list[int] | None = Ints(
        [42, 42], "image envs: env.state() grayscaled + resized to [width, height] for MAPPO's critic", nullable=True
    )


@dataclass
class MarlSettings(Section):
    """Multi-agent envs (kind pettingzoo) only; see grpo_marl/tasks/marl.py."""

    # Any, not Optional[dict]: Hydra replaces a null with a whole mapping (marl.groups={red: [...]})
    # and adds keys under it (++marl.groups.agent_0=red) only on an untyped node; the walker checks it.
    groups: Any = Map(None, "agent->group overrides ({agent_0: red} or {red: [agent_*]}); null = by name prefix")
    share: str = Choice(
        "group", "group (parameters shared within an agent-group) | agent (one set per agent)", "group", "agent"
    )
    agent_id: bool = Bool(False, "append a one-hot of the agent's index within its group to its observation")
    num_workers: int = Int(
        -1, "env worker processes (-1 = auto: in-process on <= 2 cores, else cores-1; 0 = in-process)", lo=-1,
        hint="-1 = auto, 0 = in-process",
    )  # fmt: skip


@dataclass
class EvalSettings(Section):
    """Greedy evaluations during and after training."""

    episodes: int = Int(20, "greedy episodes of the final evaluation (and of periodic ones)", gt=0)
    final_episodes: int | None = Int(None, "episodes of the final evaluation only (null = eval.episodes)", gt=0)
    every_steps: int = Int(
        0, "periodic evaluation every N env steps (0 = final only; gym:/module:factory envs with a threshold: "
        "total_steps/10 unless set)", lo=0, hint="0 = final evaluation only",
    )  # fmt: skip
    deterministic: bool = Bool(True, "greedy (mode) actions")
    at_start: bool = Bool(False, "also evaluate the untrained policy (logged at step 0; its time is evaluation time)")


@dataclass
class TrainSettings(Section):
    """When a run stops besides ``total_steps``."""

    stop_on_threshold: bool = Bool(False, "stop once a periodic evaluation reaches the threshold")
    threshold: Number = Float(None, "solve threshold (null = the env's registered threshold)")

    reads = ("eval",)

    @classmethod
    def errors(cls, run: DictConfig) -> list[str]:
        """A threshold stop needs a threshold and periodic evaluations to check it."""
        if run.train.stop_on_threshold is not True:
            return []
        errors = []
        if run.train.threshold is None:
            errors.append(
                f"train.stop_on_threshold=true but env {run.env!r} has no threshold; set train.threshold=<return>"
            )
        if int_or_none(run.eval.every_steps) == 0:
            errors.append(
                "train.stop_on_threshold=true needs periodic evaluations; set eval.every_steps=<env steps>, e.g. 10000"
            )
        return errors


@dataclass
class LogSettings(Section):
    """Logging cadence and sinks."""

    every: int = Int(1, "log every N updates", gt=0)
    progress: bool = Bool(True, "progress bar (steps, return, steps/s)")
    tensorboard: bool = Bool(True, "write TensorBoard event files")


@dataclass
class CheckpointSettings(Section):
    """Checkpoints of the run directory."""

    every: int = Int(10, "checkpoint every N updates (and at the end); 0 = end only", lo=0, hint="0 = only at the end")


# -- algo/<name>.yaml --------------------------------------------------------------------------------
@dataclass
class AlgoSettings(Section):
    """Base of an algorithm's section: ``name`` is looked up in the algorithm registry."""

    name: str = Str(MISSING, "algorithm (registered name)")


@dataclass
class GRPOSettings(AlgoSettings):
    """GRPO: group-relative advantages, no critic (docs/ARCHITECTURE.md, "The algorithm")."""

    name: str = Str("grpo", "algorithm (registered name)")
    group_mode: str = Registered(
        "seed", "seed (G rollouts from one initial state) | state (G branches from a snapshot; text: from prefixes of "
        "the sampled completions) | agent / seed_agent (multi-agent), or a registered mode", _group_modes,
    )  # fmt: skip
    rollout: str = Choice(
        "batch", "batch (all G x num_groups episodes start together) | stream (a slot that ends starts the next "
        "group's member at once; seed groups)", "batch", "stream",
    )  # fmt: skip
    group_size: int = Int(
        8, "G, rollouts compared within a group (>= 2)", lo=2,
        hint="a group needs at least 2 rollouts to compare; set algo.group_size=8, for example",
    )  # fmt: skip
    num_groups: int = Int(8, "groups per update", gt=0)
    advantage: str = Choice(
        "rtg", "outcome (return broadcast to every step) | rtg (per-step return-to-go, normalised over the members "
        "alive at t)", "outcome", "rtg",
    )  # fmt: skip
    scale: str = Choice(
        "group",
        "group (std within group) | batch (std over batch) | none (mean only, Dr. GRPO)",
        "group",
        "batch",
        "none",
    )
    gamma: Number = Float(0.99, "discount of the return-to-go", lo=0, hi=1)
    lr: Number = Float(0.0003, "Adam learning rate", gt=0)
    lr_schedule: str = Choice("constant", "constant | linear | cosine (over total_steps)", *SCHEDULES)
    epochs: int = Int(4, "mu, passes over each batch", gt=0)
    minibatches: int = Int(4, "minibatches per epoch", gt=0)
    clip_eps_low: Number = Float(
        0.2, "ratio clip below 1", lo=0, lt=1, hint="ratios are clipped to [1-eps_low, 1+eps_high]"
    )
    clip_eps_high: Number = Float(0.2, "ratio clip above 1 (clip-higher when > clip_eps_low)", lo=0)
    beta: Number = Float(0.0, "weight of the k3 KL to the reference policy (0 = no reference)", lo=0)
    ref_refresh: int = Int(
        0, "copy the policy into the reference every K updates (0 = frozen reference)", lo=0,
        hint="0 = frozen reference",
    )  # fmt: skip
    entropy_coef: Number = Float(0.0, "entropy bonus", lo=0)
    aggregation: str = Registered(
        "dapo", "grpo (per-rollout mean, then mean) | dapo (step/token mean) | dr_grpo (constant normaliser), or a "
        "registered one", _aggregations,
    )  # fmt: skip
    loss: str = Registered("grpo", "grpo | gspo (sequence-level ratio), or a registered GRPO loss", _grpo_losses)
    max_grad_norm: Number = Float(0.5, "gradient-norm clip (0 = off)", lo=0, hint="0 = no clipping")
    adam_eps: Number = Float(1e-05, "Adam epsilon", gt=0)
    zero_std: str = Choice(
        "keep", "keep | skip (drop zero-variance groups) | resample (DAPO dynamic sampling)", "keep", "skip", "resample"
    )
    max_resample: int = Int(3, "extra collections per update when zero_std=resample", lo=0)
    minibatch_split: str = Choice(
        "rows", "rows (random rollouts per minibatch) | groups (whole groups per minibatch, groups with signal spread "
        "evenly; LLMs: one prompt forward per group)", "rows", "groups",
    )  # fmt: skip
    micro_batch_rows: int = Int(
        0, "LLMs: rollouts per forward/backward inside a minibatch (gradient accumulation; 0 = whole minibatch)", lo=0,
        hint="0 = the whole minibatch in one pass",
    )  # fmt: skip
    branch_horizon: int = Int(0, "state groups: steps per branch (0 = to the episode's end)", lo=0,
                              hint="0 = to the episode's end")  # fmt: skip
    state_reset_frac: Number = Float(0.25, "state groups: fraction of groups started from a fresh reset", lo=0, hi=1)
    branch_credit: str = Choice(
        "sum", "state groups of text envs: sum (outcome advantage + segment advantage from the branch points' values) "
        "| replace (the segment advantage alone, VinePPO-style)", "sum", "replace",
    )  # fmt: skip
    target_kl: Number = Float(None, "stop the epoch loop early when approx_kl exceeds this", gt=0)

    reads = ("vec",)

    @classmethod
    def errors(cls, run: DictConfig) -> list[str]:
        """Group modes, rollouts and vector widths: what the env's family allows."""
        from grpo_marl.families import family_of

        return family_of(run).grpo_errors(run)


@dataclass
class PPOSettings(AlgoSettings):
    """PPO (``algo=ppo``; ``mappo`` and ``ippo`` are the same PPO with other critic options).

    Defaults are Stable-Baselines3's; ``conf/algo/{mappo,ippo}.yaml`` set the MAPPO paper's."""

    name: str = Str("ppo", "algorithm (registered name)")
    n_envs: int = Int(8, "parallel envs streaming experience (vec.num_envs is derived from this)", gt=0)
    n_steps: int = Int(2048, "steps per env per update (episodes continue across updates)", gt=0)
    batch_size: int = Int(64, "minibatch size in steps (minibatches = n_envs * n_steps // batch_size)", gt=0)
    minibatches: int = Int(
        0, "0 = derived from batch_size; set > 0 to fix the count instead", lo=0,
        hint="0 = derived from algo.batch_size",
    )  # fmt: skip
    epochs: int = Int(10, "passes over each batch", gt=0)
    lr: Number = Float(0.0003, "Adam learning rate (shared by actor and critic)", gt=0)
    lr_schedule: str = Choice("constant", "constant | linear | cosine (over total_steps; rl-zoo lin_)", *SCHEDULES)
    adam_eps: Number = Float(1e-05, "Adam epsilon", gt=0)
    gamma: Number = Float(0.99, "discount", lo=0, hi=1)
    gae_lambda: Number = Float(0.95, "GAE lambda (0 = one-step TD, 1 = Monte-Carlo minus baseline)", lo=0, hi=1)
    clip_eps: Number = Float(0.2, "ratio clip range", gt=0, lt=1)
    clip_schedule: str = Choice(
        "constant", "constant | linear (clip range decays to 0 over total_steps)", "constant", "linear"
    )
    clip_vf: Number = Float(None, "value clip range around the old prediction (null = unclipped)", gt=0)
    vf_coef: Number = Float(0.5, "value-loss weight", lo=0)
    entropy_coef: Number = Float(0.0, "entropy bonus", lo=0)
    max_grad_norm: Number = Float(0.5, "gradient-norm clip over actor + critic (0 = off)", lo=0, hint="0 = no clipping")
    normalize_advantage: bool = Bool(True, "standardize advantages per minibatch")
    normalize_reward: bool = Bool(False, "scale rewards by the running std of the discounted return (VecNormalize)")
    value_hidden: list[int] | None = Ints(None, "critic hidden sizes (null = same as policy.hidden)")
    target_kl: Number = Float(None, "stop the epoch loop early when an epoch's mean approx_kl exceeds this", gt=0)
    critic_state: bool = Bool(False, "centralized critic on a multi-agent env's global state (mappo)")
    critic_time: bool = Bool(False, "elapsed fraction of the episode as a critic input (time-aware finite horizon)")
    value_norm: bool = Bool(False, "regress returns standardized by running statistics (MAPPO ValueNorm)")
    bootstrap_truncation: bool = Bool(True, "a time-limit cut regresses to r + gamma * V(final obs) (SB3)")

    reads = ("vec",)

    @classmethod
    def errors(cls, run: DictConfig) -> list[str]:
        """The centralized critic needs agents; PPO's batch shape fixes ``vec.num_envs`` and bounds
        ``algo.minibatches``. (Which families PPO trains: :func:`grpo_marl.config.validate`.)"""
        from grpo_marl.families import family_of

        a, name = run.algo, str(run.algo.name)
        if a.critic_state and not family_of(run).multi_agent:
            return [
                f"algo={name} has a centralized critic (algo.critic_state=true) on a multi-agent env's global "
                f"state, and env {run.env!r} is single-agent; use algo=ppo"
            ]
        errors = []
        if run.vec.num_envs and a.n_envs and int(run.vec.num_envs) != int(a.n_envs):
            errors.append(
                f"vec.num_envs={run.vec.num_envs} disagrees with algo.n_envs={a.n_envs}; set algo.n_envs "
                "only (vec.num_envs is derived from it for PPO)"
            )
        if a.minibatches > a.n_envs * a.n_steps:
            errors.append(
                f"algo.minibatches={a.minibatches} exceeds the {a.n_envs * a.n_steps} steps per update "
                "(n_envs * n_steps); raise algo.batch_size or lower algo.minibatches"
            )
        return errors


# -- model/default.yaml and text/default.yaml --------------------------------------------------------
@dataclass
class LoraSettings(Section):
    """A LoRA adapter trained instead of the whole model (needs the ``lora`` extra: peft)."""

    enabled: bool = Bool(False, "train a LoRA adapter; the reference is then the adapter-free base model")
    r: int = Int(16, "adapter rank", gt=0)
    alpha: Number = Float(32, "adapter scale numerator (scale = alpha / r)", gt=0)
    dropout: Number = Float(0.0, "adapter dropout", lo=0, lt=1)
    target_modules: Any = Free("all-linear", "modules to adapt (peft syntax: a string or a list of module names)")
    save_adapter: bool = Bool(
        False, "model.save with LoRA: false = merge the adapter into a plain model dir, true = save the adapter alone"
    )


@dataclass
class ModelSettings(Section):
    """Causal LM of text envs (env kind "text"); control and multi-agent envs ignore this section."""

    path: str | None = Str(
        None, "HF model dir, a .gguf file, pkg://<package>/<file>, or a hub name; null = a tiny model built from "
        "the fields below",
    )  # fmt: skip
    arch: str = Choice("gpt2", "tiny model: gpt2 | qwen2", "gpt2", "qwen2")
    hidden_size: int = Int(64, "tiny model width", gt=0)
    num_layers: int = Int(2, "tiny model transformer blocks", gt=0)
    num_heads: int = Int(4, "tiny model attention heads", gt=0)
    intermediate_size: int = Int(256, "tiny model MLP width", gt=0)
    tie_embeddings: bool = Bool(True, "tiny model: share input embedding and LM head")
    max_positions: int = Int(64, "tiny model context length (prompt + completion)", gt=0)
    dtype: str = Choice(
        "auto", "auto (float32 master weights; autocast=auto runs CUDA matmuls in bf16) | float32 | bfloat16 | float16",
        "auto", "float32", "bfloat16", "float16",
    )  # fmt: skip
    gradient_checkpointing: bool = Bool(False, "recompute activations in backward (less memory, ~30% slower)")
    trust_remote_code: bool = Bool(False, "allow custom model code from model.path")
    save: bool = Bool(True, "write the final policy as a plain HF model dir in <run_dir>/model")
    lora: LoraSettings = _section(LoraSettings, "LoRA adapter")

    reads = ("algo", "env_kwargs")

    @classmethod
    def errors(cls, run: DictConfig) -> list[str]:
        """The model of a text family's Task: the family owns the rules (model paths, prompt files,
        extras, the advantage its rewards allow; :meth:`grpo_marl.families.EnvFamily.text_errors`)."""
        from grpo_marl.families import family_of

        return family_of(run).text_errors(run)


@dataclass
class TextSettings(Section):
    """Sampling, prompts, logging and warm start of text envs; other env kinds ignore this section."""

    max_new_tokens: int | None = Int(
        None, "completion budget in tokens; null = the task's budget", gt=0, hint="null = the task's hint"
    )
    temperature: Number = Float(1.0, "sampling temperature (training log-probs use the same temperature)", gt=0)
    top_p: Number = Float(1.0, "nucleus sampling mass (1 = off)", gt=0, hi=1)
    chat_template: Any = Choice(
        "auto", "auto (the tokenizer's template for chat-message prompts) | true (every prompt) | false (never)",
        "auto", True, False,
    )  # fmt: skip
    system_prompt: str | None = Str(None, "system message added to prompts without one (null = the template's)")
    mask_truncated: bool = Bool(False, "drop completions that hit max_new_tokens without EOS from the loss (DAPO)")
    prompt_sampling: str = Choice(
        "uniform", "uniform (seeded shuffles, every prompt once per epoch) | hard (weights 1 - accuracy + hard_floor)",
        "uniform", "hard",
    )  # fmt: skip
    hard_floor: Number = Float(0.1, "prompt_sampling=hard: weight floor, so solved prompts are still revisited", gt=0)
    eval_prompts: int = Int(0, "greedy eval on this many eval-split prompts (0 = all of them)", lo=0,
                            hint="0 = all of them")  # fmt: skip
    eval_batch: int = Int(256, "prompts per greedy eval generate call", gt=0)
    log_completions: int = Int(4, "completions appended to completions.jsonl (and TensorBoard text) per log", lo=0)
    log_completions_every: int = Int(50, "updates between completion logs (0 = never)", lo=0, hint="0 = never")
    sft_steps: int = Int(0, "supervised warm start on the train split's answers before GRPO (0 = off)", lo=0,
                         hint="0 = no warm start")  # fmt: skip
    sft_lr: Number = Float(0.003, "warm-start learning rate (its own Adam)", gt=0)
    sft_batch: int = Int(64, "warm-start prompts per step", gt=0)
    sft_weight_decay: Number = Float(0.0, "warm-start AdamW decoupled weight decay", lo=0)
    branch_rule: str = Choice(
        "every", "algo.group_mode=state: where completions branch: every (each branch_every tokens) | entropy (the "
        "tokens whose sampling distribution had the highest entropy)", "every", "entropy",
    )  # fmt: skip
    branch_every: int | None = Int(
        None, "algo.group_mode=state, branch_rule=every: tokens between branch points; null = the completion budget "
        "split evenly, max_new_tokens // (branch_points + 1)", gt=0, hint="null = the budget split evenly",
    )  # fmt: skip
    branch_points: int = Int(2, "algo.group_mode=state: at most this many branch points per completion", gt=0)
    branch_size: int = Int(
        4, "algo.group_mode=state: continuations sampled from each branch point's prefix (its value estimate)", gt=0
    )
    branch_train: bool = Bool(
        False, "algo.group_mode=state: train on the continuations too (each a member of its prompt's group, its "
        "tokens after the branch point credited with its return minus the prefix's value), not only use them as "
        "value estimates",
    )  # fmt: skip


# -- the top level -----------------------------------------------------------------------------------
@dataclass
class RunSettings(Section):
    """A training run (``conf/config.yaml``); every key can be overridden on the command line."""

    env: str = Str("cartpole", "registered name, gym:<Gymnasium id>, or package.module:factory")
    env_kwargs: dict[str, Any] = Map({}, "keyword arguments for the env factory (free-form)")
    seed: int = Int(1, "seeds torch, numpy and the env reset seeds", lo=0)
    device: str = Str("auto", "auto (CUDA when present) | cpu | cuda | cuda:N")
    total_steps: int = Int(100000, "env steps to train for (envs set their own)", gt=0)
    resume: str | None = Str(None, "run directory to continue (only total_steps, device, logging may change)")
    threads: int = Int(0, "torch intra-op threads (0 = auto: 1 for MLP control, torch's default for LLMs)", lo=0,
                       hint="0 = auto")  # fmt: skip
    autocast: str = Choice(
        "auto", "bfloat16 autocast of rollouts and the loss: auto (on for LLM policies on CUDA) | none | bf16",
        "auto", "none", "bf16",
    )  # fmt: skip
    distributed: DistributedSettings = _section(DistributedSettings, "torchrun data parallelism")
    vec: VecSettings = _section(VecSettings, "vector env")
    policy: PolicySettings = _section(PolicySettings, "control policy network")
    env_preprocess: EnvPreprocessSettings = _section(EnvPreprocessSettings, "PettingZoo observation preprocessing")
    marl: MarlSettings = _section(MarlSettings, "multi-agent options")
    eval: EvalSettings = _section(EvalSettings, "evaluation")
    train: TrainSettings = _section(TrainSettings, "stopping")
    log: LogSettings = _section(LogSettings, "logging")
    checkpoint: CheckpointSettings = _section(CheckpointSettings, "checkpoints")
    algo: Any = field(default=MISSING, metadata={"help": "algorithm config group: grpo, ppo, ippo, mappo"})
    model: ModelSettings = _section(ModelSettings, "causal LM of text envs")
    text: TextSettings = _section(TextSettings, "sampling and logging of text envs")

    @classmethod
    def errors(cls, run: DictConfig) -> list[str]:
        """``device`` names a device this machine has."""
        import re

        dev = str(run.device)
        if not (dev in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", dev)):
            return [f"device={dev} is not valid; use auto, cpu, cuda or cuda:N"]
        if dev.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                return [f"device={dev} but CUDA is not available here; use device=auto or device=cpu"]
        return []


# -- the walker --------------------------------------------------------------------------------------
def algo_settings(name: str) -> type[AlgoSettings] | None:
    """The section class of algorithm ``name`` (its ``settings``), None for an unknown algorithm."""
    from grpo_marl.algos import ALGOS, _load_builtin_algos

    _load_builtin_algos()
    algo = ALGOS.find(name)
    return getattr(algo, "settings", None) if algo is not None else None


def sections(algo: str) -> Iterator[tuple[str, type[Section]]]:
    """``(dotted prefix, section class)`` of every section of a run with algorithm ``algo``, the
    top level first (prefix ``""``)."""

    def walk(cls: type[Section], prefix: str) -> Iterator[tuple[str, type[Section]]]:
        yield prefix, cls
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            sub = _section_type(f)
            if f.name == "algo" and not prefix:
                found = algo_settings(algo)
                if found is not None:
                    yield from walk(found, "algo.")
            elif sub is not None:
                yield from walk(sub, f"{prefix}{f.name}.")

    yield from walk(RunSettings, "")


def _section_type(f: dataclasses.Field[Any]) -> type[Section] | None:
    if "key" in f.metadata or not callable(f.default_factory):
        return None
    made = f.default_factory()
    return type(made) if isinstance(made, Section) else None


def declared(algo: str) -> dict[str, tuple[Key, str, Any]]:
    """Every dotted key of a run with algorithm ``algo``: ``(Key, help, default)``."""
    out: dict[str, tuple[Key, str, Any]] = {}
    for prefix, cls in sections(algo):
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if "key" in f.metadata:
                default = f.default_factory() if callable(f.default_factory) else f.default
                out[prefix + f.name] = (f.metadata["key"], f.metadata["help"], default)
    return out


def reference(algo: str) -> DictConfig:
    """Every key a run with algorithm ``algo`` has, with its default: what a key may name."""
    ref = OmegaConf.structured(RunSettings)
    found = algo_settings(algo)
    ref.algo = OmegaConf.structured(found) if found is not None else {}
    return ref


def check_value(key: str, value: Any, spec: Key) -> str | None:
    """The message for one bad value, or None."""
    shown = _show(value) if not isinstance(value, str) else (repr(value) if value == "" else value)
    if value is None:
        return None if spec.nullable else f"{key}=null is not allowed; it must be {spec.describe()}"
    what = f"{key}={shown}"
    if spec.kind == "any":
        return None
    choices = spec.options()
    if choices is not None:
        if any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in choices):
            return None
        return f"{what} is not valid; choose one of {', '.join(_show(c) for c in choices)}"
    if spec.kind == "bool":
        return None if isinstance(value, bool) else f"{what} must be true or false"
    if spec.kind == "str":
        return None if isinstance(value, str) and value else f"{what} must be a non-empty string"
    if spec.kind == "map":
        return None if isinstance(value, (dict, DictConfig)) else f"{what} must be a mapping ({{key: value}})"
    if spec.kind == "ints":
        items = list(value) if isinstance(value, (list, tuple, ListConfig)) else None
        if items is None or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items):
            return f"{what} must be {spec.describe()}"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{what} must be {'an integer' if spec.kind == 'int' else 'a number'}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{what} must be a finite number"
    if spec.kind == "int" and int(value) != value:
        return f"{what} must be an integer"
    bad = (
        (spec.gt is not None and not value > spec.gt)
        or (spec.lo is not None and not value >= spec.lo)
        or (spec.lt is not None and not value < spec.lt)
        or (spec.hi is not None and not value <= spec.hi)
    )
    if not bad:
        return None
    return f"{what} must be {_range(spec)}" + (f" ({spec.hint})" if spec.hint else "")


def _range(spec: Key) -> str:
    if spec.lo is not None and spec.hi is not None:
        return f"in [{_num(spec.lo)}, {_num(spec.hi)}]"
    return " and ".join(f"{sign} {_num(b)}" for b, sign in spec._bounds() if b is not None)


_ABSENT = object()


def check(run: DictConfig) -> dict[str, str]:
    """``{dotted key: message}`` for every declared key whose value has the wrong type or range."""
    problems: dict[str, str] = {}
    for key, (spec, _, _) in declared(str(OmegaConf.select(run, "algo.name"))).items():
        node = OmegaConf.select(run, key, default=_ABSENT, throw_on_missing=False)
        if node is _ABSENT:
            continue  # sections a config may lack (e.g. built without the text group)
        value = OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node
        message = check_value(key, value, spec)
        if message:
            problems[key] = message
    return problems


# -- ConfigStore and the reference -------------------------------------------------------------------
#: ConfigStore names of the base nodes the YAML files build on: ``(group, name, node)``.
BASE_NODES: tuple[tuple[str | None, str, type], ...] = (
    (None, "base_config", RunSettings),
    ("algo", "base_grpo", GRPOSettings),
    ("algo", "base_ppo", PPOSettings),
    ("model", "base_model", ModelSettings),
    ("text", "base_text", TextSettings),
)


def register_configs() -> None:
    """Store the dataclasses in Hydra's ConfigStore (idempotent: storing again replaces them)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for group, name, node in BASE_NODES:
        store.store(group=group, name=name, node=node)


def reference_markdown() -> str:
    """``docs/CONFIG.md``: every key with its default, its range or choices and its help."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the dataclasses of `grpo_marl/settings.py` (`python -m grpo_marl.train --help-config`);",
        "`tests/test_config.py` checks that this file is up to date. Precedence, lowest first: these",
        "defaults < the `grpo_marl/conf` files < the algorithm's and env's tuned defaults < your config",
        "file < the command line.",
    ]
    titles = {"grpo": "GRPO (`algo=grpo`)", "ppo": "PPO (`algo=ppo`, `algo=ippo`, `algo=mappo`)"}
    for algo in ("grpo", "ppo"):
        keys = declared(algo)
        if algo == "grpo":
            rows = [k for k in keys if not k.startswith("algo.")]
            lines += ["", "## Run", "", "| key | default | values | meaning |", "|---|---|---|---|"]
            lines += [_row(k, *keys[k]) for k in rows]
        lines += ["", f"## {titles[algo]}", "", "| key | default | values | meaning |", "|---|---|---|---|"]
        lines += [_row(k, *keys[k]) for k in keys if k.startswith("algo.")]
    return "\n".join(lines) + "\n"


def _row(key: str, spec: Key, help: str, default: Any) -> str:
    if spec.registered is not None:
        values = "a registered name"
    elif spec.kind == "any":
        values = "see meaning"
    elif spec.kind == "map":
        values = "a mapping"
    else:
        values = spec.describe() + (" (or null)" if spec.nullable and spec.options() is not None else "")
    shown = "null" if default is None else _show(default) if not isinstance(default, list) else str(default)
    escaped = help.replace("|", "\\|")  # a literal | inside a Markdown table cell
    return f"| `{key}` | `{shown}` | {values} | {escaped} |"
