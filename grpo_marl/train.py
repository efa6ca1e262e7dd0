"""Command-line training: ``python -m grpo_marl.train env=NAME [algo=grpo|ppo] [key=value ...]``.

Hydra composes the config (``-m`` sweeps too); the env's tuned defaults are merged under the
command line; the config is validated before anything is built, so a bad value fails in
milliseconds with what to change instead of minutes into a run.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

import grpo_marl.config as config_mod  # registers the ${safe:} resolver before Hydra composes
import grpo_marl.distributed as dist  # registers the torchrun batch-split validator
from grpo_marl.checkpoint import checkpoint_path
from grpo_marl.policies.mlp import UnsupportedSpaceError
from grpo_marl.registry import UnknownEnvError


def _resume_config(cfg: DictConfig, overrides: list[str]) -> tuple[DictConfig, Path]:
    run_dir = Path(str(cfg.resume)).expanduser()
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists() or not checkpoint_path(run_dir).exists():
        raise config_mod.ConfigError(
            f"resume={run_dir}: expected {cfg_path} and {checkpoint_path(run_dir)}; pass the directory "
            "of a run that wrote at least one checkpoint"
        )
    saved = OmegaConf.load(cfg_path)
    # Only a few keys may change on resume (e.g. extend training); the rest must match the run.
    allowed = {
        "total_steps", "device", "log.progress", "log.tensorboard", "threads",
        "autocast", "distributed.backend", "distributed.find_unused_parameters",
    }  # fmt: skip
    with open_dict(saved):
        for key in config_mod.user_override_keys(overrides):
            if key == "resume":
                continue
            if key not in allowed:
                raise config_mod.ConfigError(
                    f"{key} cannot change when resuming (allowed: {', '.join(sorted(allowed))})"
                )
            OmegaConf.update(saved, key, OmegaConf.select(cfg, key), merge=False)
        saved.resume = str(run_dir)
    config_mod.validate(saved)
    return saved, run_dir


def run(cfg: DictConfig, overrides: list[str], run_dir: Path) -> dict:
    from grpo_marl.trainer import Trainer

    if cfg.resume:
        cfg, run_dir = _resume_config(cfg, overrides)
        trainer = Trainer(cfg, run_dir, resume=True)
    else:
        cfg = config_mod.resolve_config(cfg, overrides)
        trainer = Trainer(cfg, run_dir)
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    if trainer.is_main:
        _print_summary(summary, run_dir)
    return summary


def _print_summary(summary: dict, run_dir: Path) -> None:
    parts = [f"env={summary['env']} algo={summary['algo']} seed={summary['seed']}"]
    if "eval/return_mean" in summary:
        parts.append(
            f"final eval ({int(summary.get('eval/episodes', 0))} greedy episodes): "
            f"return {summary['eval/return_mean']:.2f} +- {summary['eval/return_std']:.2f}"
        )
    if "eval/accuracy" in summary:
        parts.append(f"accuracy {summary['eval/accuracy']:.3f}")
    parts.append(f"env steps {summary['env_steps']}, wall {summary['wall_seconds']:.1f} s")
    if summary.get("steps_to_threshold") is not None:
        parts.append(
            f"threshold {summary['threshold']} reached at {summary['steps_to_threshold']} steps / "
            f"{summary['time_to_threshold_s']:.1f} s"
        )
    parts.append(f"run dir {run_dir}")
    print(" | ".join(parts), flush=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    if dist.env_world_size() > 1:
        # torchrun: every rank trains in rank 0's run dir (Hydra's default dir has a timestamp,
        # which differs per process; ranks > 0 were pointed at a throwaway dir, see below).
        ctx = dist.init(str((cfg.get("distributed") or {}).get("backend", "auto")))
        run_dir = Path(dist.broadcast_object(str(run_dir), ctx))
    try:
        run(cfg, list(hc.overrides.task), run_dir)
    except (config_mod.ConfigError, UnknownEnvError, UnsupportedSpaceError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Exception as exc:
        from grpo_marl.trainer import STOP_ERRORS

        if isinstance(exc, STOP_ERRORS):
            dist.barrier_on_failure(dist.init())
            where = f"rank {dist.env_rank()}: " if dist.env_world_size() > 1 else ""
            print(f"error: {where}{exc}\nThe last good checkpoint is kept in {run_dir}", file=sys.stderr)
            sys.exit(1)
        raise
    finally:
        dist.shutdown()


def rank_overrides(argv: list[str], rank: int, world: int) -> tuple[list[str], str | None]:
    """Extra Hydra overrides for torchrun rank ``rank`` > 0, and the throwaway dir they use.

    Hydra creates its run dir (and ``.hydra/``, ``train.log``) before our code runs; ranks > 0
    must write nothing, so they get no output subdir, no log files and, unless the user fixed
    ``hydra.run.dir``, a temporary run dir (removed at exit). :func:`main` then replaces it with
    rank 0's real run dir, broadcast over the process group.
    """
    if world <= 1 or rank == 0:
        return [], None
    extra = ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    scratch = tempfile.mkdtemp(prefix=f"grpo_marl_rank{rank}_")
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        if not any(a.startswith((f"{key}=", f"+{key}=")) for a in argv):
            extra.append(f"{key}={scratch}")
    return extra, scratch


if __name__ == "__main__":
    _extra, _scratch = rank_overrides(sys.argv[1:], dist.env_rank(), dist.env_world_size())
    sys.argv.extend(_extra)
    try:
        main()
    finally:
        if _scratch is not None:
            shutil.rmtree(_scratch, ignore_errors=True)
