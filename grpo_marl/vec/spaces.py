"""Per-agent observation handling shared by every vector env: flattening and action masks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def obs_part(space: Any) -> Any:
    """The observation sub-space of a ``Dict(observation=..., action_mask=...)`` space."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict) and "observation" in space.spaces:
        return space.spaces["observation"]
    return space


def is_image_space(space: Any) -> bool:
    """A uint8 Box of rank 3 (``H x W x C`` or ``C x H x W``): kept as uint8 and fed to a CNN."""
    from gymnasium import spaces

    space = obs_part(space)
    return isinstance(space, spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def obs_dtype_problem(obs: Any, space: Any) -> str | None:
    """Why ``obs`` does not fit its Box ``space``'s dtype, or None.

    Checked on an env's first reset only (a per-step check would cost every step): an integer
    space (a uint8 image) given float values is cast by the vector env, so floats in [0, 1]
    become 0 and 1 and the policy trains on a blank image without a word; other non-integral
    floats would be truncated."""
    from gymnasium import spaces

    space = obs_part(space)
    if isinstance(obs, Mapping) and "observation" in obs:
        obs = obs["observation"]
    if not isinstance(space, spaces.Box) or not np.issubdtype(space.dtype, np.integer):
        return None
    arr = np.asarray(obs)
    if not np.issubdtype(arr.dtype, np.floating) or arr.size == 0:
        return None
    if float(np.max(space.high)) > 1 and float(arr.min()) >= 0.0 and float(arr.max()) <= 1.0 and arr.max() > 0:
        return (
            f"the observation is {arr.dtype} in [0, 1] but the observation space is {space}, so it would be "
            f"cast to 0s and 1s; return (obs * 255).astype(np.{space.dtype}) from the env, or declare "
            f"Box(0.0, 1.0, {tuple(space.shape)}, np.float32)"
        )
    if not np.array_equal(arr, np.round(arr)):
        return (
            f"the observation is {arr.dtype} with fractional values but the observation space is {space}, "
            f"so they would be truncated; return obs.astype(np.{space.dtype}) from the env, or declare a float Box"
        )
    return None


def flat_obs_dim(space: Any) -> int:
    """Length of the float vector :func:`flatten_obs` produces for ``space``."""
    from gymnasium import spaces

    from grpo_marl.errors import UnsupportedSpaceError

    space = obs_part(space)
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, spaces.Box | spaces.MultiBinary):
        return int(np.prod(space.shape))
    if isinstance(space, spaces.Dict | spaces.Tuple):
        # Dict(observation=..., action_mask=...) is read above; any other Dict/Tuple needs flattening.
        raise UnsupportedSpaceError(
            f"observation space {space} is a {type(space).__name__}, which the policy cannot read; wrap the env in "
            "gymnasium.wrappers.FlattenObservation (one Box) in its factory (a Dict with 'observation' and "
            "'action_mask' keys is read as an action-masked env)"
        )
    raise UnsupportedSpaceError(
        f"observation space {space} is not supported; supported: Box, Discrete, MultiDiscrete, MultiBinary"
    )


def flatten_obs(space: Any, obs: Any, out: np.ndarray | None = None) -> np.ndarray:
    """Observation -> float32 vector (Discrete/MultiDiscrete one-hot; Box/MultiBinary flattened)."""
    from gymnasium import spaces

    inner = obs_part(space)
    if isinstance(obs, dict) and "observation" in obs:
        obs = obs["observation"]
    dim = flat_obs_dim(inner)
    vec = np.zeros(dim, np.float32) if out is None else out
    if isinstance(inner, spaces.Discrete):
        vec[:] = 0.0
        vec[int(obs) - int(inner.start)] = 1.0
    elif isinstance(inner, spaces.MultiDiscrete):
        vec[:] = 0.0
        offsets = np.concatenate([[0], np.cumsum(inner.nvec.ravel())[:-1]])
        vec[offsets + np.asarray(obs).ravel()] = 1.0
    else:
        vec[:] = np.asarray(obs, dtype=np.float32).ravel()
    return vec


def obs_writer(space: Any) -> Callable[[Any, np.ndarray], None]:
    """A fast ``(obs, out_row) -> None`` writer for one agent's observation into its array row."""
    from gymnasium import spaces

    inner = obs_part(space)
    if is_image_space(inner):

        def write_image(obs: Any, out: np.ndarray) -> None:
            raw = obs["observation"] if isinstance(obs, dict) else obs
            out[...] = raw

        return write_image
    if isinstance(inner, spaces.Box | spaces.MultiBinary):
        d = flat_obs_dim(inner)

        def write_box(obs: Any, out: np.ndarray) -> None:
            raw = obs["observation"] if isinstance(obs, dict) else obs
            out[:d] = np.asarray(raw, dtype=np.float32).ravel()

        return write_box

    def write_onehot(obs: Any, out: np.ndarray) -> None:
        flatten_obs(space, obs, out[: flat_obs_dim(inner)])

    return write_onehot


def action_mask_of(obs: Any, info: Mapping[str, Any] | None) -> np.ndarray | None:
    """The env-provided action mask (``obs["action_mask"]`` or ``info["action_mask"]``), if any."""
    if isinstance(obs, dict) and "action_mask" in obs:
        return np.asarray(obs["action_mask"], dtype=bool)
    if info and "action_mask" in info:
        return np.asarray(info["action_mask"], dtype=bool)
    return None
