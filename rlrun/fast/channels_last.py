"""Frames laid out channels-last for the Nature CNN, whose convolution backward oneDNN runs faster so."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ChannelsLast(nn.Module):
    """model(obs) on the frames obs [B, C, H, W] copied channels-last: a drop-in for the module A2C's steps run."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        out_value: tuple[Tensor, Tensor] = self.model(obs.contiguous(memory_format=torch.channels_last))
        return out_value
