"""Feature encoders from observations: an MLP for vectors, the Nature CNN (Mnih et al. 2015) for frames, and one
encoder per key for Dict observations with image keys (a CNN per image, concatenated with the other keys)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar, cast

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
Layer = TypeVar("Layer", nn.Linear, nn.Conv2d)  # what layer_init initializes, and returns as it was given
# (offset, (C, H, W)) of each image key laid flat in encoded Dict observations (rlrun.envs.spaces.EncodedBox.images)
Images = Sequence[tuple[int, Sequence[int]]]


def layer_init(layer: Layer, gain: float = math.sqrt(2), bias: float = 0.0) -> Layer:
    """Orthogonal weights and constant bias, as in the PPO implementation details (Huang et al. 2022)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


class FlatFloat(nn.Module):
    """[B, ...] -> [B, prod(...)] float32: an MLP's input from observations of any shape and dtype (uint8 ones
    stay bytes in rollouts and replays)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(1).float()


def mlp(in_dim: int, hidden_sizes: list[int], activation: str) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = [FlatFloat()]
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(in_dim, size)), ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers), in_dim


class TwinMLP(nn.Module):
    """Two MLPs of equal shape on the same input (actor and critic trunks), computed together: one matmul
    per layer instead of two. The same function and initialization as two separate MLPs, with half the
    operator calls, which is what small-network PPO time goes to on CPU. [B, in] -> ([B, h], [B, h])."""

    def __init__(self, in_dim: int, hidden_sizes: list[int], activation: str):
        super().__init__()
        first, rest = hidden_sizes[0], hidden_sizes[1:]
        # Layer 1: both trunks read the same input, so their weights stack into one Linear.
        self.first = nn.Linear(in_dim, 2 * first)
        for half in self.first.weight.data.chunk(2), self.first.bias.data.chunk(2):
            for block in half:
                nn.init.orthogonal_(block, math.sqrt(2)) if block.dim() == 2 else nn.init.zeros_(block)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        sizes = [first, *rest]
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            w = torch.empty(2, n_in, n_out)
            for block in w:
                nn.init.orthogonal_(block, math.sqrt(2))
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(2, 1, n_out)))
        self.activation = ACTIVATIONS[activation]()
        self.out_dim = sizes[-1]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.activation(self.first(x.flatten(1).float()))  # [B, 2h]: both trunks' first layers in one
        h = h.view(len(x), 2, -1).transpose(0, 1)  # [2, B, h]: actor, critic
        for w, b in zip(self.weights, self.biases):
            h = self.activation(torch.baddbmm(b, h, w))
        return h[0], h[1]

    @property
    def relu(self) -> bool:
        return isinstance(self.activation, nn.ReLU)


class NatureCNN(nn.Module):
    """uint8 frames [B, C, H, W] (84x84 in the paper; 36x36 at least) -> features [B, hidden]; scales to [0, 1]
    inside. `width`: H when None (square frames)."""

    LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (channels, kernel, stride), no padding
    MIN_SIZE = 36  # the smallest side these kernels and strides leave a 1x1 output of

    def __init__(self, in_channels: int, hidden: int, screen_size: int = 84, width: int | None = None):
        super().__init__()
        layers, channels, h, w = [], in_channels, screen_size, width or screen_size
        for out_channels, kernel, stride in self.LAYERS:
            layers += [layer_init(nn.Conv2d(channels, out_channels, kernel, stride=stride)), nn.ReLU()]
            channels, h, w = out_channels, (h - kernel) // stride + 1, (w - kernel) // stride + 1
        self.conv = nn.Sequential(*layers, nn.Flatten())
        # The feature size by arithmetic, not a probe forward: env workers build this on the meta device, where a
        # convolution runs a Python kernel that imports sympy (a second).
        self.fc = nn.Sequential(layer_init(nn.Linear(channels * h * w, hidden)), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        # Scaling to [0, 1] is folded into the first layer's weights: one op on a small tensor instead of one
        # on the whole batch. (.float() keeps the frames' memory layout, channels-last or not.)
        first = cast(nn.Conv2d, self.conv[0])
        h = F.conv2d(x.float(), first.weight / 255.0, first.bias, first.stride, first.padding)
        features: Tensor = self.fc(self.conv[1:](h))
        return features


class SmallCNN(nn.Module):
    """uint8 frames [B, C, H, W] smaller than the Nature CNN takes (MiniGrid's 7x7 views) -> features [B, hidden]:
    3x3 convolutions, padded, the last two with stride 2; scales to [0, 1] inside."""

    def __init__(self, in_channels: int, hidden: int, height: int, width: int):
        super().__init__()
        layers, channels, h, w = [], in_channels, height, width
        for out_channels, stride in ((32, 1), (64, 2), (64, 2)):
            layers += [layer_init(nn.Conv2d(channels, out_channels, 3, stride=stride, padding=1)), nn.ReLU()]
            channels, h, w = out_channels, (h - 1) // stride + 1, (w - 1) // stride + 1
        self.conv = nn.Sequential(*layers, nn.Flatten())
        self.fc = nn.Sequential(layer_init(nn.Linear(channels * h * w, hidden)), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        features: Tensor = self.fc(self.conv(x.float() / 255.0))
        return features


class CombinedEncoder(nn.Module):
    """Encoded Dict observations [B, size] (rlrun/envs/spaces.py) with image keys laid flat in channel-first order
    at `images` ((offset, (C, H, W)) each) -> features [B, hidden_sizes[-1]]: each image through a CNN of its own
    (the Nature CNN, or the small one under 36x36) to hidden_sizes[-1] features, concatenated with the other
    entries (one-hots, vectors, the action mask) as they are, then the MLP. SB3's CombinedExtractor, with the
    policy's MLP on top."""

    def __init__(self, size: int, images: Images, hidden_sizes: list[int], activation: str):
        super().__init__()
        self.images = [(int(offset), tuple(int(n) for n in chw)) for offset, chw in images]
        self.cnns = nn.ModuleList(cnn(chw, hidden_sizes[-1]) for _, chw in self.images)
        # The entries outside images, as (start, end) slices: plain ints, so copies built on the meta device (env
        # workers' policies) need no buffer.
        self.rest, start = [], 0
        for offset, chw in self.images:
            if offset > start:
                self.rest.append((start, offset))
            start = offset + math.prod(chw)
        if size > start:
            self.rest.append((start, size))
        in_dim = len(self.images) * hidden_sizes[-1] + sum(end - start for start, end in self.rest)
        self.mlp, self.out_dim = mlp(in_dim, hidden_sizes, activation)

    def forward(self, x: Tensor) -> Tensor:
        x = x.float()
        parts = [net(x[:, o : o + math.prod(chw)].view(-1, *chw)) for net, (o, chw) in zip(self.cnns, self.images)]
        parts += [x[:, start:end] for start, end in self.rest]
        features: Tensor = self.mlp(torch.cat(parts, 1))
        return features


def cnn(chw: tuple[int, int, int], hidden: int) -> nn.Module:
    """The CNN for uint8 images [C, H, W]: the Nature CNN where they are large enough for it, else the small one."""
    c, h, w = chw
    return NatureCNN(c, hidden, h, w) if min(h, w) >= NatureCNN.MIN_SIZE else SmallCNN(c, hidden, h, w)


def encoder_name(name: str, shape: tuple[int, ...], dtype: np.dtype, images: Images = ()) -> str:
    """The encoder a model named `name` gets for observations of `shape` and `dtype`: images (uint8 [C, H, W])
    get a CNN whatever the model (mlp, or a recurrent model's mlp encoder): the Nature CNN where they are large
    enough for it, else the small one; encoded Dict observations with image keys at `images` one encoder per key
    ("combined"); everything else the MLP."""
    if images:
        return "combined"
    if not (np.dtype(dtype) == np.uint8 and len(shape) == 3):
        return "mlp" if name == "small_cnn" else name
    return "nature_cnn" if min(shape[1:]) >= NatureCNN.MIN_SIZE else "small_cnn"


def observation_dtype(shape: tuple[int, ...], dtype: np.dtype) -> torch.dtype:
    """The dtype networks take observations of `shape` and numpy `dtype` in: uint8 frames [C, H, W] stay bytes
    (the Nature CNN scales them inside, and rollouts and replays of frames are 4x smaller so); every other
    observation (float64, integer or uint8 vectors) becomes float32, what nn.Linear computes in."""
    return torch.uint8 if np.dtype(dtype) == np.uint8 and len(shape) == 3 else torch.float32


def build_encoder(name: str, obs_shape: tuple[int, ...], hidden_sizes: list[int], activation: str, images: Images = ()):
    """(encoder, feature size) for the model named in config (`images`: for "combined", CombinedEncoder's)."""
    if name == "combined":
        encoder = CombinedEncoder(math.prod(obs_shape), images, hidden_sizes, activation)
        return encoder, encoder.out_dim
    if name in ("nature_cnn", "small_cnn"):
        if len(obs_shape) != 3:
            raise ValueError(f"{name} needs image observations [C, H, W], got shape {obs_shape}")
        c, h, w = obs_shape
        cnn = NatureCNN(c, hidden_sizes[-1], h, w) if name == "nature_cnn" else SmallCNN(c, hidden_sizes[-1], h, w)
        return cnn, hidden_sizes[-1]
    return mlp(math.prod(obs_shape), hidden_sizes, activation)
