"""Evaluate a saved run: ``python -m grpo_marl.evaluate run=DIR [episodes=20] [video=true]``.

Rebuilds the run's task from its saved ``config.yaml``, loads the policy from the last checkpoint
and runs greedy episodes (the same evaluation as the end of training, on fresh seeds unless
``seed_offset`` says otherwise). ``video=true`` renders episodes of Gymnasium and PettingZoo envs
(``render_mode="rgb_array"``) to animated GIFs (Pillow only, no codec needed) in ``DIR/videos``,
acting as the evaluation does (``deterministic=false`` samples actions in both: a Gaussian policy
whose learned behaviour relies on actions clipped at the bounds can act quite differently from its
mean). Results go to stdout and ``DIR/eval.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

USAGE = (
    "usage: python -m grpo_marl.evaluate run=DIR [episodes=20] [video=false] [video_episodes=1] "
    "[device=cpu] [seed_offset=2000] [deterministic=true]"
)
OPTIONS = {"run", "episodes", "video", "video_episodes", "device", "seed_offset", "deterministic"}


def load_run(run_dir: str | Path, device: str = "cpu") -> tuple[Any, Any, Any]:
    """Return ``(cfg, task, checkpoint)`` with the checkpoint's policy weights loaded."""
    from grpo_marl.algos import ALGOS, _load_builtin_algos
    from grpo_marl.checkpoint import load_checkpoint
    from grpo_marl.errors import UserInputError
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks import make_task
    from grpo_marl.trainer import resolve_device

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise UserInputError(f"{cfg_path} not found: run=... must be a run directory written by grpo_marl.train")
    cfg = OmegaConf.load(cfg_path)
    assert isinstance(cfg, DictConfig)  # a run's config.yaml is a mapping
    cfg.device = device
    dev = resolve_device(device)
    ckpt = load_checkpoint(run_dir, map_location=dev)
    _load_builtin_algos()
    task = make_task(cfg, get_spec(str(cfg.env)), dev, collector=ALGOS[str(cfg.algo.name)].collector)
    task.policy.load_state_dict(ckpt["modules"]["policy"])
    task.policy.eval()
    return cfg, task, ckpt


def _greedy(cfg: Any) -> bool:
    return bool(cfg.eval.deterministic)


def record_gifs(cfg: Any, task: Any, out_dir: Path, episodes: int, seed: int) -> list[Path]:
    """Render episodes of a Gymnasium or PettingZoo env to GIFs, greedy unless
    ``cfg.eval.deterministic`` is false."""
    from PIL import Image

    from grpo_marl.families import get_family
    from grpo_marl.registry import get_spec

    spec = get_spec(str(cfg.env))
    family = get_family(spec.kind)
    if not family.records_video:
        raise ValueError(f"video recording supports Gymnasium and PettingZoo envs, not kind {spec.kind!r}")
    if family.multi_agent:
        return _record_pettingzoo_gifs(cfg, task, out_dir, episodes, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = spec.make(**{**dict(cfg.env_kwargs or {}), "render_mode": "rgb_array"})
    fps = int(env.metadata.get("render_fps", 30))
    paths = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        frames = [env.render()]
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                action, _ = task.policy.act(
                    torch.as_tensor(np.asarray(obs)[None], device=task.device), deterministic=_greedy(cfg)
                )
            obs, reward, terminated, truncated, _ = env.step(task.policy.to_env(action)[0])
            total += float(reward)
            done = terminated or truncated
            frames.append(env.render())
        path = out_dir / f"episode_{ep}_return_{total:.0f}.gif"
        images = [Image.fromarray(f) for f in frames[::2]]  # every other frame keeps files small
        images[0].save(path, save_all=True, append_images=images[1:], duration=int(2000 / fps), loop=0)
        paths.append(path)
    env.close()
    return paths


def _record_pettingzoo_gifs(cfg: Any, task: Any, out_dir: Path, episodes: int, seed: int) -> list[Path]:
    """Multi-agent episodes through the same driver (and preprocessing) as training, one env
    built with ``render_mode="rgb_array"``; the GIF shows the env's own rendering (the full
    screen), the policy sees its preprocessed observations."""
    import functools

    from PIL import Image

    from grpo_marl.families import parallel_env
    from grpo_marl.vec.drivers import PettingZooDriver

    out_dir.mkdir(parents=True, exist_ok=True)
    kwargs = {**dict(cfg.env_kwargs or {}), "render_mode": "rgb_array"}
    env_fn = functools.partial(parallel_env, functools.partial(task.spec.make, **kwargs))
    driver = PettingZooDriver(env_fn, 1, name=str(cfg.env))
    env = driver.envs[0]
    fps = int((getattr(env, "metadata", None) or {}).get("render_fps", 30) or 30)
    limit = driver.max_episode_steps or 10_000
    paths = []
    for ep in range(episodes):
        step = driver.reset([seed + ep])
        frames = [np.asarray(driver.envs[0].render())]
        total = np.zeros(driver.layout.num_agents)
        for _ in range(limit):
            if bool(step.env_done[0]):
                break
            mask = None if step.action_mask is None else torch.as_tensor(step.action_mask, device=task.device)
            with torch.no_grad():
                action, _ = task.policy.act(
                    torch.as_tensor(step.obs, device=task.device), mask, deterministic=_greedy(cfg)
                )
            step = driver.step(task.policy.to_env(action))
            total += step.rewards[0]
            frames.append(np.asarray(driver.envs[0].render()))
        score = float(total.mean())
        path = out_dir / f"episode_{ep}_return_{score:.0f}.gif"
        stride = max(1, len(frames) // 300)  # at most ~300 frames per file
        images = [Image.fromarray(f.astype(np.uint8)) for f in frames[::stride]]
        images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 * stride / fps), loop=0)
        paths.append(path)
    driver.close()
    return paths


def parse_args(argv: list[str]) -> dict[str, Any]:
    """Checked options (defaults filled in); :class:`UserInputError` names the first bad one."""
    from grpo_marl.errors import UserInputError

    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            raise UserInputError(f"{arg!r} is not an option=value argument")
    try:
        args = OmegaConf.to_container(OmegaConf.from_dotlist(argv))
    except Exception as exc:
        raise UserInputError(f"cannot parse the arguments ({exc})") from exc
    assert isinstance(args, dict)
    unknown = sorted(set(args) - OPTIONS)
    if unknown:
        raise UserInputError(f"unknown options {unknown}")
    if "run" not in args:
        raise UserInputError("run=DIR is required")
    out: dict[str, Any] = {
        "run": str(args["run"]),
        "episodes": args.get("episodes"),
        "video": args.get("video", False),
        "video_episodes": args.get("video_episodes", 1),
        "device": str(args.get("device", "cpu")),
        "seed_offset": args.get("seed_offset", 2000),
        "deterministic": args.get("deterministic"),
    }
    for key, low in (("episodes", 1), ("video_episodes", 1), ("seed_offset", 0)):
        value = out[key]
        if value is None and key == "episodes":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserInputError(f"{key}={value} must be an integer >= {low}")
    for key in ("video", "deterministic"):
        value = out[key]
        if value is not None and not isinstance(value, bool):
            raise UserInputError(f"{key}={value} must be true or false")
    dev = out["device"]
    if not (dev in ("cpu", "cuda", "auto") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise UserInputError(f"device={dev} is not valid; use cpu, cuda, cuda:N or auto")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise UserInputError(f"device={dev} but CUDA is not available here; use device=cpu")
    return out


def check_run(args: dict[str, Any]) -> Any:
    """The run's saved config, after every check that needs no env (refusals before any work)."""
    from grpo_marl.errors import CheckpointError, MissingExtraError, UserInputError
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks import check_extras

    run_dir = Path(args["run"])
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise UserInputError(f"{cfg_path} not found: run=... must be a run directory written by grpo_marl.train")
    cfg = OmegaConf.load(cfg_path)
    assert isinstance(cfg, DictConfig)  # a run's config.yaml is a mapping
    spec = get_spec(str(cfg.env))
    check_extras(cfg, spec)
    if args["video"]:
        if spec.kind not in ("gymnasium", "pettingzoo"):
            raise UserInputError(
                f"video=true records Gymnasium and PettingZoo envs; env {cfg.env!r} is of kind {spec.kind!r} "
                "(drop video=true)"
            )
        try:
            import PIL  # noqa: F401
        except ImportError as exc:
            raise MissingExtraError(
                "video=true needs Pillow, which is not installed: pip install 'grpo_marl[video]'"
            ) from exc
    from grpo_marl.checkpoint import checkpoint_path, previous_path

    if not checkpoint_path(run_dir).exists() and not previous_path(run_dir).exists():
        raise CheckpointError(f"{checkpoint_path(run_dir)} not found: the run wrote no checkpoint to evaluate")
    from grpo_marl.rundir import COPY_IT, check_writable

    # eval.json (and videos/) go into the run: refuse now rather than after the episodes
    check_writable(run_dir, advice=COPY_IT.format(verb="evaluate"))
    return cfg


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from grpo_marl.errors import UserInputError

    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
        cfg = check_run(args)
        run_dir = Path(args["run"])
        cfg, task, ckpt = load_run(run_dir, args["device"])
    except UserInputError as exc:
        usage = f"\n{USAGE}" if "required" in str(exc) or "option" in str(exc) else ""
        print(f"error: {exc}{usage}", file=sys.stderr)
        sys.exit(2)
    episodes = int(args["episodes"] if args["episodes"] is not None else cfg.eval.episodes)
    capacity = task.eval_capacity()
    if capacity is not None and args["episodes"] is not None:
        if episodes > capacity:
            task.close()
            print(
                f"error: episodes={episodes} but {run_dir} evaluates on a held-out split of {capacity} "
                f"prompts (one prompt is one episode); pass episodes<={capacity}, or omit episodes to "
                "evaluate the run's own number (text.eval_prompts)",
                file=sys.stderr,
            )
            sys.exit(2)
        task.eval_limit = episodes
    seed_offset = int(args["seed_offset"])
    if args["deterministic"] is not None:
        cfg.eval.deterministic = bool(args["deterministic"])
    result: dict[str, Any] = task.evaluate(task.policy, episodes, seed_offset=seed_offset)
    result.update({"run": str(run_dir), "env_steps": int(ckpt["counters"]["env_steps"])})
    try:
        if args["video"]:
            gifs = record_gifs(cfg, task, run_dir / "videos", int(args["video_episodes"]), 3_000_000 + seed_offset)
            result["videos"] = [str(p) for p in gifs]
        task.close()
        (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    except OSError as exc:  # a full disk, a read-only run dir: one line naming the file, exit 1
        from grpo_marl.errors import filesystem_message

        message = filesystem_message(exc, run_dir / ("videos" if args["video"] else "eval.json"))
        if message is None:
            raise
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items())
        print(shown, flush=True)  # the evaluation itself is done: show it before the error
        print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(1)
    shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items())
    print(shown, flush=True)
    return result


if __name__ == "__main__":
    main()
