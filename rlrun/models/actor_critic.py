"""The actor-critics PPO trains. Feedforward: a trunk (two MLPs computed together, or one shared encoder), a
policy head (categorical logits or Gaussian mean with a state-independent log-std) and a value head.
Recurrent: encoder -> recurrent core -> the same heads, with the core's state passed in and out."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlrun.config import RECURRENT_MODELS, ModelConfig
from rlrun.models import distributions as D
from rlrun.models.encoders import Images, TwinMLP, build_encoder, encoder_name, layer_init
from rlrun.models.recurrent import build_core, not_starts
from rlrun.models.user import AsGiven, check_outputs, given_space, instantiate_network


def image_parts(obs_space: gym.Space[Any]) -> Images:
    """(offset, (C, H, W)) of the image keys laid flat in encoded Dict observations (rlrun.envs.spaces.EncodedBox's
    images; empty: none)."""
    return tuple(getattr(obs_space, "images", ()))


def action_mask_size(obs_space: gym.Space[Any]) -> int:
    """How many action-mask entries end the observations (rlrun.envs.spaces.EncodedBox's mask_size; 0: none)."""
    return int(getattr(obs_space, "mask_size", 0))


class _Policy(nn.Module):
    """The action distribution on a network's policy output (categorical logits, or a Gaussian mean with a
    state-independent log-std), and what the algorithms ask of a feedforward actor-critic, whose
    forward(obs) -> (policy output, value)."""

    def _init_distribution(self, action_space: gym.Space[Any]) -> int:
        """Set up the distribution for `action_space`; returns the size of the policy output it takes: categorical
        logits (Discrete), independent categoricals' logits side by side (MultiDiscrete), Bernoulli logits
        (MultiBinary), or a Gaussian mean with a state-independent log-std (Box)."""
        self.discrete = isinstance(action_space, gym.spaces.Discrete)  # what the accelerations handle, with Box
        self.sizes: list[int] = []
        if self.discrete:
            self.kind, out = "categorical", int(action_space.n)
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            self.kind, self.sizes = "multi_categorical", [int(n) for n in action_space.nvec.ravel()]
            out = sum(self.sizes)
        elif isinstance(action_space, gym.spaces.MultiBinary):
            self.kind, out = "bernoulli", int(np.prod(action_space.shape))
        elif isinstance(action_space, gym.spaces.Box):
            self.kind, out = "gaussian", int(action_space.shape[0])
            self.log_std = nn.Parameter(torch.zeros(out))
        else:
            raise ValueError(
                f"actor-critics take Discrete, Box, MultiDiscrete and MultiBinary actions, not {action_space}"
            )
        self.policy_size = out
        return out

    def _init_mask(self, obs_space: gym.Space[Any]) -> None:
        self.mask_size = action_mask_size(obs_space)

    def _masked(self, out: Tensor, obs: Tensor) -> Tensor:
        """The policy output with illegal actions' logits at -1e9 (probability 0, and 0 in the entropy), where the
        env gives action masks: the last mask_size entries of the observations (rlrun/envs/spaces.py)."""
        if not self.mask_size:
            return out
        return out.masked_fill(obs[..., -self.mask_size :] < 0.5, -1e9)

    def _init_heads(self, features: int, action_space: gym.Space[Any]) -> None:
        self.policy_head = layer_init(nn.Linear(features, self._init_distribution(action_space)), gain=0.01)
        self.value_head = layer_init(nn.Linear(features, 1), gain=1.0)

    def sample(self, out: Tensor, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """(action, log-prob) from the policy output."""
        if self.discrete:
            log_p = torch.log_softmax(out, -1)
            action = out.argmax(-1) if deterministic else D.categorical_sample(log_p)
            return action, D.categorical_log_prob(log_p, action)
        if self.kind == "gaussian":
            action = out if deterministic else D.gaussian_sample(out, self.log_std)
            return action, D.gaussian_log_prob(out, self.log_std, action)
        if self.kind == "multi_categorical":
            action = D.multi_categorical_sample(out, self.sizes, deterministic)
        else:
            action = D.bernoulli_sample(out, deterministic)
        return action, self.log_prob_entropy(out, action)[0]

    def log_prob_entropy(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """(log-prob, entropy) of `actions` under the policy output `out` (any leading shape); summed over the
        components of multi-dimensional actions."""
        if self.discrete:
            log_p = torch.log_softmax(out, -1)
            return D.categorical_log_prob(log_p, actions), D.categorical_entropy(log_p)
        if self.kind == "multi_categorical":
            return D.multi_categorical_log_prob_entropy(out, self.sizes, actions)
        if self.kind == "bernoulli":
            return D.bernoulli_log_prob_entropy(out, actions)
        return D.gaussian_log_prob(out, self.log_std, actions), D.gaussian_entropy(out, self.log_std)

    def value(self, obs: Tensor) -> Tensor:
        value: Tensor = self(obs)[1]
        return value

    def act(self, obs: Tensor, deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(action [B] or [B, D], log-prob [B], value [B]) for a batch of observations."""
        out, value = self(obs)
        return *self.sample(out, deterministic), value

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log-prob [B], entropy [B], value [B]) of given actions."""
        out, value = self(obs)
        return *self.log_prob_entropy(out, actions), value


class ActorCritic(_Policy):
    def __init__(self, cfg: ModelConfig, obs_space: gym.spaces.Box, action_space: gym.Space[Any]):
        super().__init__()
        images = image_parts(obs_space)
        name = encoder_name(cfg.name, obs_space.shape, obs_space.dtype, images)
        self._init_mask(obs_space)
        self.shared = cfg.shared or name != "mlp"  # a CNN is one trunk for both heads
        if self.shared:
            self.trunk, features = build_encoder(name, obs_space.shape, cfg.hidden_sizes, cfg.activation, images)
        else:  # separate actor and critic trunks (CleanRL's classic-control layout)
            self.trunk = TwinMLP(math.prod(obs_space.shape), cfg.hidden_sizes, cfg.activation)
            features = self.trunk.out_dim
        self._init_heads(features, action_space)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """(policy head output [B, A] logits or [B, D] Gaussian mean, value [B]) for observations [B, ...]."""
        if self.shared:
            actor = critic = self.trunk(obs)
        else:
            actor, critic = self.trunk(obs)
        return self._masked(self.policy_head(actor), obs), self.value_head(critic).squeeze(-1)


class UserActorCritic(_Policy):
    """A user's network (model._target_) as an actor-critic: `net(obs [B, ...])` returns (logits [B, A] for a
    Discrete action space, or the Gaussian mean [B, D] for a Box one, whose log-std is a parameter here; value
    [B]). Observations come as the env gives them, as float32 (uint8 for image frames [C, H, W]); Dict and Tuple
    ones as a dict of tensors (rlrun.models.user.AsGiven). Where the env gives action masks, illegal actions'
    logits are masked here, after the network."""

    def __init__(self, net: nn.Module, action_space: gym.Space[Any], obs_space: gym.Space[Any]):
        super().__init__()
        self.net = net
        self._init_distribution(action_space)
        self.mask_size = action_mask_size(obs_space)
        self.as_given = AsGiven(obs_space)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        outputs: tuple[Tensor, Tensor] = self.net(self.as_given(obs))
        if not self.mask_size:  # as the network returns them, for check_outputs to judge
            return outputs
        out, value = outputs
        return self._masked(out, obs), value


class RecurrentActorCritic(_Policy):
    """encoder (MLP or Nature CNN, per step) -> recurrent core (LSTM, GRU or LRU) -> policy and value heads.

    `state` [B, S] is the core's state before the step; `starts` [B] (or [T, B]) marks the envs whose episode
    starts with this observation, whose state is reset to zero first. Acting steps the core once; `evaluate`
    replays whole sequences [T, B] from their initial state, resetting where episodes start inside them.
    """

    def __init__(self, cfg: ModelConfig, obs_space: gym.spaces.Box, action_space: gym.Space[Any]):
        super().__init__()
        self._init_mask(obs_space)
        images = image_parts(obs_space)
        name = encoder_name(cfg.encoder, obs_space.shape, obs_space.dtype, images)
        self.encoder, features = build_encoder(name, obs_space.shape, cfg.hidden_sizes, cfg.activation, images)
        self.core = build_core(cfg.name, features, cfg.core_size, cfg.activation, cfg.lru_decay)
        self._init_heads(self.core.out_dim, action_space)

    @property
    def state_size(self) -> int:
        return self.core.state_size

    def initial_state(self, num_envs: int, device: torch.device) -> Tensor:
        return torch.zeros(num_envs, self.core.state_size, device=device)

    def _step(self, obs: Tensor, state: Tensor, starts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(policy head output, value [B], next state) for one step of a batch [B, ...]."""
        features, state = self.core.step(self.encoder(obs), state * not_starts(starts, state))
        return self._masked(self.policy_head(features), obs), self.value_head(features).squeeze(-1), state

    def value(self, obs: Tensor, state: Tensor, starts: Tensor) -> Tensor:
        """V of obs [B, ...] after `state`; the state it would move to is not kept."""
        return self._step(obs, state, starts)[1]

    def act(
        self, obs: Tensor, state: Tensor, starts: Tensor, deterministic: bool = False
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(action, log-prob [B], value [B], next state [B, S]) for one step of a batch of envs."""
        out, value, state = self._step(obs, state, starts)
        return *self.sample(out, deterministic), value, state

    def evaluate(self, obs: Tensor, actions: Tensor, state: Tensor, starts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log-prob [T, B], entropy [T, B], value [T, B]) of the actions taken along sequences obs [T, B, ...]
        that started from `state` [B, S], with episode starts [T, B]."""
        steps, envs = starts.shape
        features = self.encoder(obs.flatten(0, 1)).unflatten(0, (steps, envs))  # one batched call for all steps
        features, _ = self.core(features, state, starts)
        out, value = self._masked(self.policy_head(features), obs), self.value_head(features).squeeze(-1)
        return *self.log_prob_entropy(out, actions), value


def build_actor_critic(
    cfg: ModelConfig, obs_space: gym.spaces.Box, action_space: gym.Space[Any]
) -> ActorCritic | RecurrentActorCritic | UserActorCritic:
    if cfg._target_ is not None:
        net = instantiate_network(cfg, given_space(obs_space), action_space)
        model = UserActorCritic(net, action_space, obs_space)
        head = "Gaussian mean" if model.kind == "gaussian" else "logits"
        check_outputs(model, cfg._target_, obs_space, {head: (2, model.policy_size), "value": (2,)})
        return model
    if cfg.name in RECURRENT_MODELS:
        return RecurrentActorCritic(cfg, obs_space, action_space)
    return ActorCritic(cfg, obs_space, action_space)
