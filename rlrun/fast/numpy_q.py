"""DQN's epsilon-greedy acting without torch's per-operator overhead: the MLP Q-network's forward pass in numpy, on
views of the live parameters, and only for the envs that act greedily this step (DQN draws the noise that decides
which, and their random actions); a step where every env explores makes no forward pass at all. A drop-in for
DQNParts.epsilon_greedy; tests/unit/test_fast_paths.py checks both act alike, and a run checks it on its first step
(fast/selfcheck.py)."""

from __future__ import annotations

import numpy as np

from rlrun.fast.fused_dqn import q_forward, q_params, relu_encoder
from rlrun.models.q_network import QNetwork


class NumpyEpsilonGreedy:
    def __init__(self, model: QNetwork):
        self.params = [p.detach().numpy() for p in q_params(model)]  # views: updated in place by the optimizer
        self.relu = relu_encoder(model)
        self.num_actions = model.head.out_features

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q [N, A] of obs [N, ...], as QNetwork's forward."""
        return q_forward(obs, self.params, self.relu)[1]

    def __call__(self, obs: np.ndarray, explore: np.ndarray, random: np.ndarray) -> np.ndarray:
        """Actions [N] for obs [N, ...]: random [N] where explore [N], else argmax Q."""
        n = np.count_nonzero(explore)  # a C call: ndarray.any() and .all() pass through Python, 1 us each a step
        if n == len(obs):
            return random
        if not n:  # (with one env, every step is one of these two)
            actions: np.ndarray = self.q_values(obs).argmax(1)
            return actions
        actions = random.copy()
        greedy = ~explore
        actions[greedy] = self.q_values(obs[greedy]).argmax(1)
        return actions
