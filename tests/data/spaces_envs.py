"""Envs for tests/runs/test_any_env.py and bench/learning/test_any_env_learning.py (env.imports=[spaces_envs], from the
working directory the tests copy this file into): a target to hit with MultiDiscrete or MultiBinary actions, image
observations in height-width-channel layout, Dict observations (one with a key no network can take, one with an
image and a direction and a user's network that reads them), action masks, and an env whose constructor fails."""

import gymnasium as gym
import numpy as np
import torch


class Target(gym.Env):
    """Each step rewards the components of the action that match a fixed target; 8 steps an episode."""

    def __init__(self, kind="multidiscrete"):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        if kind == "multidiscrete":
            self.action_space, self.target = gym.spaces.MultiDiscrete([3, 4]), np.array([2, 1])
        else:
            self.action_space, self.target = gym.spaces.MultiBinary(4), np.array([1, 0, 1, 1])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        reward = float((np.asarray(action) == self.target).sum())
        return np.zeros(2, np.float32), reward, False, self.t >= 8, {}


class Frames(gym.Env):
    """uint8 frames [H, W, 3]: the right action is the one whose half of the frame is lit; 8 steps an episode."""

    def __init__(self, size=7):
        self.size = size
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(2)

    def _frame(self):
        self.side = int(self.np_random.integers(2))
        frame = np.zeros((self.size, self.size, 3), np.uint8)
        half = self.size // 2
        frame[:, :half] = 255 if self.side == 0 else 0
        frame[:, half:] = 255 if self.side == 1 else 0
        return frame

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        reward = float(action == self.side)
        return self._frame(), reward, False, self.t >= 8, {}


class Notes(gym.Env):
    """A Dict observation: a position (Discrete), a vector (Box) and a note (Text) no network takes; the reward is
    for repeating the position as the action."""

    def __init__(self, noise=False):
        self.noise = noise  # the vector: noise around 3 (what normalization rescales), or zeros
        self.observation_space = gym.spaces.Dict(
            {"pos": gym.spaces.Discrete(3), "vec": gym.spaces.Box(-10, 10, (2,)), "note": gym.spaces.Text(8)}
        )
        self.action_space = gym.spaces.Discrete(3)

    def _obs(self):
        self.pos = int(self.np_random.integers(3))
        vec = 3 + 2 * self.np_random.standard_normal(2) if self.noise else np.zeros(2)
        return {"pos": self.pos, "vec": vec.astype(np.float32), "note": "hi"}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = float(action == self.pos)
        return self._obs(), reward, False, self.t >= 8, {}


class Masked(gym.Env):
    """Action 0 pays 2, action 1 pays 1, action 2 nothing; at each step action 0 or action 1 is illegal (raises),
    which the mask says: in an action_mask key of a Dict observation, or through action_masks() (method=True).
    The best legal play scores 8 x 1.5 = 12; random legal play 6."""

    def __init__(self, method=False):
        self.method = method
        box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        mask = gym.spaces.MultiBinary(3)
        self.observation_space = box if method else gym.spaces.Dict({"pos": box, "action_mask": mask})
        self.action_space = gym.spaces.Discrete(3)

    def action_masks(self):
        return self.mask

    def _obs(self):
        self.mask = np.array([0, 1, 1] if self.np_random.integers(2) else [1, 0, 1], np.int8)
        pos = np.zeros(2, np.float32)
        return pos if self.method else {"pos": pos, "action_mask": self.mask}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if not self.mask[action]:
            raise RuntimeError(f"illegal action {action} under mask {self.mask}")
        self.t += 1
        return self._obs(), float([2, 1, 0][action]), False, self.t >= 8, {}


class Compass(gym.Env):
    """A Dict observation as MiniGrid's: an image [5, 5, 3] uint8 (its left or right half lit) and a direction
    (Discrete(4)). The right action is (direction + lit half) % 4, so a policy must read both; 8 steps an episode
    (best 8, random 2)."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict(
            {"image": gym.spaces.Box(0, 255, (5, 5, 3), np.uint8), "direction": gym.spaces.Discrete(4)}
        )
        self.action_space = gym.spaces.Discrete(4)

    def _obs(self):
        self.side, self.direction = (int(x) for x in self.np_random.integers((2, 4)))
        image = np.zeros((5, 5, 3), np.uint8)
        (image[:, :2] if self.side == 0 else image[:, 3:])[:] = 255
        return {"image": image, "direction": self.direction}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = float(action == (self.direction + self.side) % 4)
        return self._obs(), reward, False, self.t >= 8, {}


class CompassNet(torch.nn.Module):
    """A user's network that reads the Dict as the env gives it: a CNN on obs["image"] [B, 5, 5, 3] uint8 (in the
    env's own layout) and an embedding of obs["direction"] [B] int64 (neither would take the encoded vector). Q-values
    (q=True) or (logits, value)."""

    def __init__(self, observation_space, action_space, q=False):
        super().__init__()
        assert set(observation_space.spaces) == {"image", "direction"}, observation_space
        self.q = q
        self.conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten())
        self.embed = torch.nn.Embedding(observation_space["direction"].n, 16)
        self.body = torch.nn.Sequential(torch.nn.Linear(8 * 9 + 16, 64), torch.nn.ReLU())
        self.pi, self.v = torch.nn.Linear(64, action_space.n), torch.nn.Linear(64, 1)

    def forward(self, obs):
        image, direction = obs["image"], obs["direction"]
        assert image.dtype == torch.uint8 and image.shape[1:] == (5, 5, 3), (image.dtype, image.shape)
        assert direction.dtype == torch.int64 and direction.shape == image.shape[:1], direction.shape
        h = torch.cat([self.conv(image.permute(0, 3, 1, 2).float() / 255), self.embed(direction)], -1)
        h = self.body(h)
        return self.pi(h) if self.q else (self.pi(h), self.v(h).squeeze(-1))


class Broken(gym.Env):
    def __init__(self):
        raise ValueError("the simulator's licence file is missing")


gym.register("TargetMD-v0", entry_point=Target, kwargs={"kind": "multidiscrete"})
gym.register("TargetMB-v0", entry_point=Target, kwargs={"kind": "multibinary"})
gym.register("Frames-v0", entry_point=Frames)
gym.register("Notes-v0", entry_point=Notes)
gym.register("Broken-v0", entry_point=Broken)
gym.register("Compass-v0", entry_point=Compass)
gym.register("Masked-v0", entry_point=Masked)
gym.register("MaskedMethod-v0", entry_point=Masked, kwargs={"method": True})
