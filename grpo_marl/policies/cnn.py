"""Image encoder of the control actor and critic: a Nature-CNN (Mnih et al. 2015), as in
Stable-Baselines3's ``CnnPolicy``.

Observations stay ``uint8[..., H, W, C]`` (channel-last, as PettingZoo and SuperSuit hand them
out) from the vector env through storage and batches; this module is the only place they become
float: ``x.float() / 255``, channels moved first, three conv layers (8x8/4, 4x4/2, 3x3/1; 32, 64,
64 channels, ReLU) and a linear layer to ``features_dim`` (512) features with ReLU. The actor's
head MLP (``policy.hidden``) then sits on these features (see :mod:`grpo_marl.policies.mlp`,
``policy.encoder=auto|mlp|cnn``).

The PPO critic reuses the actor's encoder for the agent's own observation (SB3's
``share_features_extractor=True``). MAPPO's centralized critic on image envs reads a
*downsampled global state*: ``env.state()`` (the full screen) grayscaled and resized with
SuperSuit's transforms to ``env_preprocess.state_resize`` (default 42x42), scaled to [0, 1] and
flattened (:mod:`grpo_marl.marl.preprocess`). Why that and not the concatenated agent encodings:
it keeps the one ``float32[E, S]`` state contract every vector env, collector and checkpoint
already follow (no second image path), costs ``S * 4`` bytes per step (7 KB at 42x42), and
needs no row to carry every agent's observation (which would multiply storage and encoder passes
by the number of agents). The critic sees the whole scene coarsely plus its agent's own
high-resolution features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from grpo_marl.errors import UnsupportedSpaceError

#: Smallest image side the three Nature-CNN convolutions accept (8/4 -> 4/2 -> 3/1).
MIN_SIDE = 36


class NatureCNN(nn.Module):
    """``uint8[..., H, W, C]`` -> ``float32[..., features_dim]`` (leading dims kept)."""

    def __init__(self, obs_shape: Sequence[int], features_dim: int = 512) -> None:
        super().__init__()
        if len(obs_shape) != 3:
            raise UnsupportedSpaceError(
                f"the CNN encoder takes H x W x C images, got an observation of shape {tuple(obs_shape)}"
            )
        h, w, c = (int(d) for d in obs_shape)
        if min(h, w) < MIN_SIDE:
            raise UnsupportedSpaceError(
                f"image observations of {h}x{w} are too small for the Nature-CNN encoder (needs >= {MIN_SIDE}x{MIN_SIDE}); "
                f"raise env_preprocess.resize or set policy.encoder=mlp"
            )
        self.obs_shape = (h, w, c)
        self.features_dim = int(features_dim)
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n_flat = int(self.convs(torch.zeros(1, c, h, w)).shape[1])
        self.linear = nn.Sequential(nn.Linear(n_flat, self.features_dim), nn.ReLU())
        for m in self.modules():  # SB3/CleanRL init: orthogonal, gain sqrt(2), zero bias
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.orthogonal_(m.weight, gain=math.sqrt(2))
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, obs: Tensor) -> Tensor:
        lead = obs.shape[:-3]
        x = obs.reshape(-1, *self.obs_shape).permute(0, 3, 1, 2).float().div_(255.0)
        return self.linear(self.convs(x)).reshape(*lead, self.features_dim)


def resolve_encoder(setting: str, is_image: bool) -> str:
    """``policy.encoder``: ``auto`` -> ``cnn`` for image observations, else ``mlp``; ``cnn`` on a
    vector env is refused (there is no image to convolve)."""
    from grpo_marl.errors import UserInputError

    if setting not in ("auto", "mlp", "cnn"):
        raise UserInputError(f"policy.encoder={setting!r} is unknown; choose one of auto, mlp, cnn")
    if setting == "auto":
        return "cnn" if is_image else "mlp"
    if setting == "cnn" and not is_image:
        raise UserInputError(
            "policy.encoder=cnn needs image observations (a uint8 H x W x C Box); this env's are vectors: "
            "use policy.encoder=auto or mlp"
        )
    return setting
