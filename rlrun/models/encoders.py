"""Feature encoders from observations: an MLP for vectors, the Nature CNN (Mnih et al. 2015) for frames."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def layer_init(layer: nn.Module, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights and constant bias, as in the PPO implementation details (Huang et al. 2022)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden_sizes: list[int], activation: str) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = [nn.Flatten()]
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(in_dim, size)), ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers), in_dim


class NatureCNN(nn.Module):
    """uint8 frames [B, C, 84, 84] -> features [B, hidden]; scales to [0, 1] inside."""

    def __init__(self, in_channels: int, hidden: int, screen_size: int = 84):
        super().__init__()
        self.conv = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.conv(torch.zeros(1, in_channels, screen_size, screen_size)).shape[1]
        self.fc = nn.Sequential(layer_init(nn.Linear(n, hidden)), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.conv(x.float() / 255.0))


def build_encoder(name: str, obs_shape: tuple[int, ...], hidden_sizes: list[int], activation: str):
    """(encoder, feature size) for the model named in config."""
    if name == "nature_cnn":
        if len(obs_shape) != 3:
            raise ValueError(f"nature_cnn needs image observations [C, H, W], got shape {obs_shape}")
        return NatureCNN(obs_shape[0], hidden_sizes[-1], obs_shape[-1]), hidden_sizes[-1]
    return mlp(math.prod(obs_shape), hidden_sizes, activation)
