"""Rollout storage for on-policy algorithms: preallocated [T, N, ...] tensors, filled in place each step."""

from __future__ import annotations

import torch
from torch import Tensor


class Rollout:
    """What the policy produced lives on the device; what the env returned (rewards, flags) lives in CPU
    tensors whose numpy views take each step's arrays without a conversion (moved to the device once per
    update, a no-op on CPU). For a recurrent policy (state_size > 0) it also holds each env's state at the
    rollout's start and where episodes start, which is all the update needs to replay the rollout."""

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: torch.dtype,
        action_shape: tuple[int, ...],
        action_dtype: torch.dtype,
        device: torch.device,
        state_size: int = 0,
    ):
        def zeros(*shape: int, dtype: torch.dtype = torch.float32, on: torch.device = device) -> Tensor:
            return torch.zeros((num_steps, num_envs, *shape), dtype=dtype, device=on)

        cpu = torch.device("cpu")
        self.obs = zeros(*obs_shape, dtype=obs_dtype)
        self.actions = zeros(*action_shape, dtype=action_dtype)
        self.log_probs = zeros()
        self.values = zeros()
        self.next_values = zeros()  # V of the observation after each step (final obs when truncated)
        self.rewards = zeros(on=cpu)
        self.terminated = zeros(dtype=torch.bool, on=cpu)
        self.truncated = zeros(dtype=torch.bool, on=cpu)
        self.initial_state = torch.zeros(num_envs, state_size, device=device)  # [N, S] before step 0
        self.starts = zeros(dtype=torch.bool)  # obs[t] is the first of an episode: the state was reset before it
        self.rewards_np = self.rewards.numpy()
        self.terminated_np = self.terminated.numpy()
        self.truncated_np = self.truncated.numpy()


def minibatch_indices(batch_size: int, num_minibatches: int) -> list[Tensor]:
    """A fresh permutation of range(batch_size) cut into equal minibatches (torch's global RNG): of the
    T x N steps for a feedforward policy, of the N env sequences for a recurrent one."""
    return list(torch.randperm(batch_size).chunk(num_minibatches))


def minibatch_slices(batch_size: int, num_minibatches: int) -> list[slice]:
    """range(batch_size) cut into num_minibatches consecutive parts, as equal as can be (the first ones one longer):
    a rollout cut short need not divide evenly, and every rank must still take num_minibatches steps."""
    size, longer = divmod(batch_size, num_minibatches)
    bounds = [i * size + min(i, longer) for i in range(num_minibatches + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def take_rows(x: Tensor, index: Tensor) -> Tensor:
    """x[index] along the first dim, as a copy of whole rows (index_select: several times faster than x[index]
    for frames). Channels-last frames [B, C, H, W] are gathered as the NHWC rows they are in memory and stay
    channels-last."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return x.permute(0, 2, 3, 1).index_select(0, index).permute(0, 3, 1, 2)
    return x.index_select(0, index)
