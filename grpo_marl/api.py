"""The Python API, next to the CLI: ``fit`` trains a run, ``load`` brings back its policy.

    import grpo_marl
    result = grpo_marl.fit(env="cartpole", total_steps=50_000, seed=2)   # same config as the CLI
    print(result.summary["eval/return_mean"], result.run_dir)
    policy = grpo_marl.load(result.run_dir)
    action = policy.act(obs)                  # numpy in, numpy out (a dict per agent for PettingZoo)

``fit`` composes the same Hydra config the CLI does (``grpo_marl/conf`` + the env's tuned
defaults + your overrides), validates it the same way and writes the same run directory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_marl.errors import UserInputError
from grpo_marl.families import family_of
from grpo_marl.overrides import overrides_from_mapping


@dataclass
class FitResult:
    """What a finished :func:`fit` returns: the ``summary.json`` content and the run directory."""

    summary: dict[str, Any]
    run_dir: Path

    def load(self, device: str = "cpu") -> TrainedPolicy:
        return load(self.run_dir, device=device)


def fit(env: str = "cartpole", *, run_dir: str | Path | None = None, **overrides: Any) -> FitResult:
    """Train ``env`` with the CLI's configuration plus ``overrides`` and return the summary.

    Overrides are config keys: ``algo="ppo"``, ``total_steps=50_000``, dotted keys through a dict
    (``**{"algo.lr": 1e-3}``) or nested dicts (``algo={"lr": 1e-3}``), or ``algo__lr=1e-3``.
    ``run_dir`` defaults to ``runs/<env>/<algo>_seed<seed>_<time>`` like the CLI. Configuration
    mistakes raise :class:`grpo_marl.errors.UserInputError` before anything is built.
    """
    from omegaconf import OmegaConf, open_dict

    from grpo_marl.config import _safe, check_command_line, compose
    from grpo_marl.train import run

    args, late = overrides_from_mapping(overrides)
    args.insert(0, f"env={env}")
    problems = check_command_line(args)  # the CLI's checks: unknown keys with "did you mean", options
    if problems:
        raise UserInputError("invalid overrides:\n  - " + "\n  - ".join(problems))
    try:
        cfg = compose(args)  # a value of the wrong type: ConfigError, the CLI's message
    except UserInputError:
        raise
    except Exception as exc:  # Hydra's own errors for what the checks above do not cover
        raise UserInputError(f"invalid overrides {args[1:]}: {exc}") from exc
    with open_dict(cfg):
        for key, value in late.items():
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    if run_dir is None:
        stamp = time.strftime("%Y%m%d_%H%M%S") + f"_{time.time_ns() % 1_000_000:06d}"
        algo = (
            str(overrides.get("algo", cfg.algo.name)) if isinstance(overrides.get("algo"), str) else str(cfg.algo.name)
        )
        run_dir = Path("runs") / _safe(env) / f"{algo}_seed{cfg.seed}_{stamp}"
    run_dir = Path(run_dir)
    summary = run(cfg, args, run_dir)
    return FitResult(summary=summary, run_dir=run_dir)


class TrainedPolicy:
    """A trained control policy, for use outside the trainer (numpy in, numpy out).

    Single-agent envs: ``act(obs)`` takes one observation (or a batch ``[N, ...]``) and returns
    the action(s). Multi-agent envs: ``act({agent: obs})`` returns ``{agent: action}`` for the
    agents given (others are absent, e.g. agents that already left the episode); ``obs`` may also
    be a batch ``[N, ...]`` per agent (numpy or torch, as a VMAS env hands them out), giving
    ``[N, ...]`` actions per agent.
    """

    def __init__(self, policy: Any, layout: Any, cfg: Any, device: torch.device) -> None:
        from grpo_marl.vec.spaces import obs_writer

        self.policy = policy
        self.layout = layout
        self.cfg = cfg
        self.device = device
        self.agents = layout.agents
        self.multi_agent = family_of(cfg).multi_agent
        self._writers = [obs_writer(space) for space in layout.observation_spaces]

    def _encode(self, observations: list[list[Any]]) -> np.ndarray:
        lay = self.layout
        out = np.zeros((len(observations), lay.num_agents, *lay.obs_shape), lay.obs_dtype)
        for i, row in enumerate(observations):
            for j, o in enumerate(row):
                if o is not None:
                    self._writers[j](o, out[i, j])
        return out

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = True) -> Any:
        """The policy's action for ``obs`` (greedy unless ``deterministic=False``).

        Observations are checked against the spaces the policy was trained on: a wrong shape or a
        non-numeric dtype raises :class:`UserInputError` naming the expected shape (a mis-shaped
        array would otherwise be read as a batch and return a batch of wrong actions)."""
        if self.multi_agent:
            if not isinstance(obs, Mapping):
                raise UserInputError(
                    f"this policy controls agents {list(self.agents)}: pass a dict agent -> observation"
                )
            unknown = sorted(set(obs) - set(self.agents))
            if unknown:
                raise UserInputError(f"unknown agents {unknown}; this policy controls {list(self.agents)}")
            spaces_ = self.layout.observation_spaces
            given = {a: _host(o) for a, o in obs.items() if o is not None}
            singles = {
                a: check_observation(o, spaces_[self.agents.index(a)], f"the observation of {a!r}", batch=True)
                for a, o in given.items()
            }
            if all(singles.values()):
                x = self._encode([[given.get(a) for a in self.agents]])
                actions = self._act(x, deterministic)[0]
                return {a: actions[j] for j, a in enumerate(self.agents) if a in given}
            # a batch per agent, [N, *shape] each (a batched simulator's observations, VMAS's)
            sizes = {len(o) for a, o in given.items() if not singles[a]}
            if any(singles.values()) or len(sizes) != 1:
                raise UserInputError(
                    "pass one observation per agent, or a batch of the same size N for every agent "
                    f"(got batch sizes {sorted(sizes)} and single observations for {[a for a in given if singles[a]]})"
                )
            n = sizes.pop()
            x = self._encode([[given[a][i] if a in given else None for a in self.agents] for i in range(n)])
            actions = self._act(x, deterministic)
            return {a: actions[:, j] for j, a in enumerate(self.agents) if a in given}
        space = self.layout.observation_spaces[0]
        single = check_observation(obs, space, "the observation", batch=True)
        batch = [obs] if single else list(np.asarray(obs))
        actions = self._act(self._encode([[o] for o in batch]), deterministic)[:, 0]
        return actions[0] if single else actions

    def _act(self, x: np.ndarray, deterministic: bool) -> np.ndarray:
        actions, _ = self.policy.act(torch.as_tensor(x, device=self.device), None, deterministic=deterministic)
        return self.policy.to_env(actions)


def _host(obs: Any) -> Any:
    """A tensor observation (a torch simulator's, on any device) as numpy; anything else as it is."""
    return obs.detach().cpu().numpy() if isinstance(obs, torch.Tensor) else obs


def check_observation(obs: Any, space: Any, what: str, batch: bool) -> bool:
    """Raise :class:`UserInputError` unless ``obs`` is one observation of ``space`` (or, with
    ``batch``, a ``[N, *shape]`` stack of them); return whether it is a single observation.

    Dict observations carrying an action mask (``{"observation": ..., "action_mask": ...}``) are
    checked on their ``observation`` part."""
    from grpo_marl.vec.spaces import obs_part

    inner = obs_part(space)
    if isinstance(obs, Mapping):
        if "observation" not in obs:
            raise UserInputError(f"{what} is a dict without an 'observation' entry; expected {inner}")
        obs, batch = obs["observation"], False
    shape = tuple(getattr(inner, "shape", None) or ())
    dtype = getattr(inner, "dtype", None)
    named = f"Box(shape={shape}, dtype={dtype})" if type(inner).__name__ == "Box" else str(inner)
    try:
        arr = np.asarray(obs)
    except (TypeError, ValueError) as exc:
        raise UserInputError(f"{what} is not an array of numbers ({exc}); expected shape {shape}") from exc
    if arr.dtype.kind not in "biuf":
        raise UserInputError(f"{what} has dtype {arr.dtype}; expected numbers of shape {shape} ({named})")
    if arr.shape == shape:
        single = True
    elif batch and arr.ndim == len(shape) + 1 and arr.shape[1:] == shape:
        single = False
    else:
        stack = ", or a batch of shape (N" + "".join(f", {d}" for d in shape) + (",)" if not shape else ")")
        raise UserInputError(
            f"{what} has shape {arr.shape}; this policy expects shape {shape}"
            + (stack if batch else "")
            + f" (its observation space is {named})"
        )
    if dtype is not None and np.issubdtype(dtype, np.integer) and arr.dtype.kind == "f":
        if not np.array_equal(arr, np.round(arr)):
            raise UserInputError(f"{what} has fractional values but the observation space is {named} (integers)")
    return single


def load(run_dir: str | Path, device: str = "cpu") -> TrainedPolicy:
    """The policy of a run directory (its last checkpoint), ready to ``act`` on numpy inputs."""
    from grpo_marl.evaluate import load_run

    cfg, task, _ = load_run(run_dir, device=device)
    family = family_of(cfg)
    if not family.vectorized:
        task.close()
        hint = (
            "its model is a Hugging Face directory, load it with transformers' "
            "AutoModelForCausalLM.from_pretrained(<run>/model)"
            if (Path(run_dir) / "model").is_dir()
            else "load() acts on numpy observations of vectorized envs"
        )
        raise UserInputError(
            f"{run_dir} is a {family.name} run ({family.plural} are not stepped as numpy arrays): {hint}"
        )
    policy = TrainedPolicy(task.policy, task.vec.layout, cfg, torch.device(device))
    task.close()
    return policy
