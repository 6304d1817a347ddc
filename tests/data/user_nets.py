"""Users' own networks for the tests (model._target_=user_nets.NAME, from the working directory), each with one
of the DDP edge cases users' networks bring."""

import math

import torch
from torch import nn


def _body(observation_space, hidden):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(observation_space.shape), hidden), nn.Tanh())


def _out(action_space):
    return int(action_space.n) if hasattr(action_space, "n") else int(action_space.shape[0])


class TinyActorCritic(nn.Module):
    """forward(obs) -> (logits or Gaussian mean [B, A], value [B])."""

    def __init__(self, observation_space, action_space, hidden=32):
        super().__init__()
        self.body = _body(observation_space, hidden)
        self.pi = nn.Linear(hidden, _out(action_space))
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class TinyQ(nn.Module):
    """forward(obs) -> Q-values [B, A]."""

    def __init__(self, observation_space, action_space, hidden=32):
        super().__init__()
        self.net = nn.Sequential(_body(observation_space, hidden), nn.Linear(hidden, _out(action_space)))

    def forward(self, obs):
        return self.net(obs)


class WithEvalHead(TinyActorCritic):
    """A head the loss never uses (say, for an auxiliary evaluation)."""

    def __init__(self, observation_space, action_space, hidden=32):
        super().__init__(observation_space, action_space, hidden)
        self.eval_head = nn.Linear(hidden, 3)


class FrozenEmbedding(TinyActorCritic):
    """A frozen first layer: no gradient is wanted for it, so DDP has nothing to wait for."""

    def __init__(self, observation_space, action_space, hidden=32):
        super().__init__(observation_space, action_space, hidden)
        self.body[1].requires_grad_(False)


class SometimesBranch(TinyActorCritic):
    """A branch used in every other training forward only."""

    def __init__(self, observation_space, action_space, hidden=32):
        super().__init__(observation_space, action_space, hidden)
        self.branch = nn.Linear(hidden, hidden)
        self.calls = 0

    def forward(self, obs):
        h = self.body(obs)
        if self.training and torch.is_grad_enabled():
            self.calls += 1
            if self.calls % 2 == 1:
                h = h + torch.tanh(self.branch(h))
        return self.pi(h), self.v(h).squeeze(-1)


class BatchNormNet(TinyActorCritic):
    """BatchNorm after the first layer."""

    def __init__(self, observation_space, action_space, hidden=32):
        super().__init__(observation_space, action_space, hidden)
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(math.prod(observation_space.shape), hidden), nn.BatchNorm1d(hidden), nn.Tanh()
        )


class WrongOutputs(nn.Module):
    """Returns one tensor where an actor-critic returns two."""

    def __init__(self, observation_space, action_space):
        super().__init__()
        self.net = nn.Linear(math.prod(observation_space.shape), 2)

    def forward(self, obs):
        return self.net(obs.flatten(1))
