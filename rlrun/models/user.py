"""Users' own networks (model._target_) are checked once, when built, against what the algorithm reads from their
forward: a mismatch is one line at start-up, not a shape error inside the first update."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlrun.errors import UserError
from rlrun.models.encoders import observation_dtype


def check_outputs(net: nn.Module, target: str, obs_space: gym.Space, expected: dict[str, tuple[int, ...]]) -> None:
    """Run `net` on a batch of 2 sample observations (eval mode, no gradient) and check it returns tensors of the
    `expected` shapes ({name: shape}, in order; one name: a tensor, several: a tuple)."""
    obs = np.stack([obs_space.sample() for _ in range(2)])
    x = torch.as_tensor(obs, dtype=observation_dtype(obs_space.shape, obs_space.dtype))
    wanted = ", ".join(f"{name} {list(shape)}" for name, shape in expected.items())
    if len(expected) > 1:
        wanted = f"({wanted})"
    training = net.training
    try:
        with torch.no_grad():
            out = net.eval()(x)
    except Exception as e:
        raise UserError(
            f"model._target_={target}: forward(obs {list(x.shape)} {x.dtype}) failed: "
            f"{type(e).__name__}: {' '.join(str(e).split())}"
        ) from e
    finally:
        net.train(training)
    got = (out,) if isinstance(out, Tensor) else tuple(out) if isinstance(out, (tuple, list)) else (out,)
    shapes = [tuple(o.shape) if isinstance(o, Tensor) else type(o).__name__ for o in got]
    if shapes != list(expected.values()):
        described = ", ".join(str(list(s)) if isinstance(s, tuple) else s for s in shapes)
        raise UserError(
            f"model._target_={target}: forward(obs {list(x.shape)}) must return {wanted} for this "
            f"env and algorithm; it returned {described}"
        )
