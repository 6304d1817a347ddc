"""The native backend (env.vector.backend=native): the vectorized implementation an env's own package ships, behind
rlrun's VectorEnv contract: gymnasium's numpy CartPoleVectorEnv (CartPole's vector entry point) and ale-py's
AtariVectorEnv (C++ threads doing the standard Atari preprocessing). tests/unit/test_native_envs.py states where
their episodes differ from those of the Python wrappers the other backends step (README: "Native vector envs")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from rlrun.config import AtariConfig, EnvConfig
from rlrun.envs.backends import check_native
from rlrun.envs.protocol import EndedEpisodes, StepResult
from rlrun.envs.sync import require_finite_rows


class Stepped(NamedTuple):
    """One step of a vectorized implementation adapted to SAME_STEP autoreset, [N, ...] each: the envs whose episode
    ended (terminated or truncated) start their next one within the step, `final` holding their last observations
    (None when none ended); `over` marks the episodes whose statistics end (a game, not a life lost); rewards raw."""

    obs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final: np.ndarray | None
    over: np.ndarray


class Inner(Protocol):
    """A vectorized implementation as NativeEnvs steps it."""

    clip: bool  # rewards go to the algorithm as their sign

    @property
    def env(self) -> gym.vector.VectorEnv: ...

    def reset(self, seeds: list[int] | None) -> tuple[np.ndarray, dict[str, Any]]: ...
    def step(self, actions: np.ndarray) -> Stepped: ...
    def state(self) -> dict[str, Any] | None: ...  # plain data, or None when it cannot be saved
    def load_state(self, state: dict[str, Any]) -> None: ...


class CartPole:
    """gymnasium's CartPoleVectorEnv, which restarts a finished episode at the next step (NEXT_STEP: that step ignores
    its action and returns reward 0), restarting it in the step that ends it instead, with the draws from its RNG
    that its own restart would make. Its state is plain arrays and an RNG: runs resume exactly."""

    clip = False

    def __init__(self, cfg: EnvConfig, num_envs: int):
        kwargs = dict(cfg.kwargs)
        if cfg.max_episode_steps is not None:  # in agent steps, as TimeLimit counts them
            kwargs["max_episode_steps"] = cfg.max_episode_steps
        env = gym.make_vec(cfg.id, num_envs, vectorization_mode="vector_entry_point", **kwargs)
        assert isinstance(env, CartPoleVectorEnv) and env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        self.env: CartPoleVectorEnv = env

    def reset(self, seeds: list[int] | None) -> tuple[np.ndarray, dict[str, Any]]:
        # One RNG draws every env's start state: the first env's seed seeds it (the others are its stream's too).
        return self.env.reset(seed=None if seeds is None else seeds[0])

    def step(self, actions: np.ndarray) -> Stepped:
        obs, rewards, terminated, truncated, _ = self.env.step(actions)
        done = terminated | truncated
        if not done.any():
            return Stepped(obs, rewards, terminated, truncated, None, done)
        e, state = self.env, self.env.state
        assert state is not None and e.prev_done is not None
        state[:, done] = e.np_random.uniform(low=e.low, high=e.high, size=(4, int(done.sum())))
        e.steps[done] = 0
        e.prev_done[done] = False  # restarted now, not at the next step
        return Stepped(state.T.astype(np.float32), rewards, terminated, truncated, obs, done)

    def state(self) -> dict[str, Any]:
        e = self.env
        arrays = {"state": e.state, "steps": e.steps, "prev_done": e.prev_done}
        plain = {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}  # copies
        return plain | {"rng": e.np_random.bit_generator.state}

    def load_state(self, state: dict[str, Any]) -> None:
        e = self.env
        e.state, e.steps, e.prev_done = (state[k].numpy().copy() for k in ("state", "steps", "prev_done"))
        e.np_random.bit_generator.state = state["rng"]


class Atari:
    """ale-py's AtariVectorEnv (SAME_STEP), with what its C++ does not do as rlrun's Python wrappers do, in numpy:
    a life lost ends a training episode while the game goes on (EpisodicLife), rewards clipped to their sign while
    the episode statistics count the game's score, and a frame stack that starts like FrameStackObservation's (the
    first frame repeated, not zeros), at a reset and at a life lost alike (DQN's replay rebuilds stacks so). The
    emulators' state stays in C++: a resumed run starts fresh episodes."""

    def __init__(self, cfg: EnvConfig, atari: AtariConfig, num_envs: int, train: bool, threads: int):
        from ale_py.vector_env import AtariVectorEnv

        options = {**gym.spec(cfg.id).kwargs, **cfg.kwargs}
        frames = options.get("max_num_frames_per_episode")
        if cfg.max_episode_steps is not None:  # in agent steps: each one frame_skip frames (no life lost cuts it)
            frames = cfg.max_episode_steps * atari.frame_skip
        self.env = AtariVectorEnv(
            options["game"],
            num_envs,
            num_threads=threads,
            max_num_frames_per_episode=frames or 0,
            repeat_action_probability=atari.repeat_action_probability,
            full_action_space=options.get("full_action_space", False),
            autoreset_mode=AutoresetMode.SAME_STEP,
            img_height=atari.screen_size,
            img_width=atari.screen_size,
            stack_num=atari.frame_stack,
            frameskip=atari.frame_skip,
            noop_max=atari.noop_max,
            episodic_life=False,  # it would restart the game at every life lost
            reward_clipping=False,  # clipped after the statistics took the score
            use_fire_reset=True,
        )
        self.life_loss = train and atari.terminal_on_life_loss
        self.clip = train and atari.clip_reward
        self.k = atari.frame_stack
        self.lives = np.zeros(num_envs, np.int32)
        self.since = np.zeros(num_envs, np.int64)  # agent steps since each stack started

    def reset(self, seeds: list[int] | None) -> tuple[np.ndarray, dict[str, Any]]:
        # The ALE takes a seed of 31 bits (-1 asks it to draw one); rlrun's env seeds are 32.
        seed = None if seeds is None else np.array([s % 2**31 for s in seeds], dtype=np.int64)
        obs, info = self.env.reset(seed=seed)
        self.lives[:], self.since[:] = info["lives"], 0
        return self._pad(obs, self.since), info

    def step(self, actions: np.ndarray) -> Stepped:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.since += 1
        over = terminated | truncated  # the game: the ALE restarted it
        final = info["final_obs"] if over.any() else None
        lost = ~over & (info["lives"] > 0) & (info["lives"] < self.lives) if self.life_loss else over & False
        if lost.any():  # the episode ends, the game goes on: its stack starts again from the newest frame
            final = obs.copy() if final is None else np.where(lost[:, None, None, None], obs, final)
            terminated = terminated | lost
        ended = over | lost
        if final is not None:
            final = self._pad(final, np.where(ended, self.since, self.k))
        self.lives = info["lives"]
        self.since[ended] = 0
        return Stepped(self._pad(obs, self.since), rewards.astype(np.float64), terminated, truncated, final, over)

    def _pad(self, obs: np.ndarray, since: np.ndarray) -> np.ndarray:
        """Stacks `obs` [N, k, ...] whose episode started `since` steps ago, with the frames before its first one
        (the ALE's zeros, or the lost life's) replaced by its first, as FrameStackObservation pads."""
        for i in np.flatnonzero(since < self.k - 1):
            first = self.k - 1 - since[i]
            obs[i, :first] = obs[i, first]
        return obs

    def state(self) -> None:
        return None

    def load_state(self, state: dict[str, Any]) -> None:
        raise AssertionError("an ALE vector env has no state to load")


class NativeEnvs:
    """The VectorEnv of a vectorized implementation (`inner`): SAME_STEP steps, each finished episode's last
    observation in info["final_obs"], the episodes' statistics as RecordEpisodeStatistics counts them (raw return
    and agent steps), and with `check_finite`, a NaN or infinite observation or reward ends the run naming the env."""

    def __init__(self, inner: Inner, check_finite: bool = True):
        self.inner, self.check_finite = inner, check_finite
        env = inner.env
        self.num_envs = env.num_envs
        self.num_workers = 0  # its threads, if any, step while the rank waits: acting may use every core
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = env.metadata
        self.groups = [slice(0, self.num_envs)]
        self.returns = np.zeros(self.num_envs)  # of the episodes under way
        self.lengths = np.zeros(self.num_envs, np.int64)
        self._result: StepResult | None = None

    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        seeds = [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else seed
        obs, info = self.inner.reset(None if seeds is None else list(seeds))
        self.returns[:], self.lengths[:] = 0, 0
        if self.check_finite:
            require_finite_rows(obs, 0, "observation")
        return obs, info

    def send(self, group: int, actions: np.ndarray) -> None:
        self._result = self.step(actions)

    def recv(self, group: int) -> StepResult:
        assert self._result is not None, "recv without send"
        result, self._result = self._result, None
        return result

    def step(self, actions: np.ndarray) -> StepResult:
        obs, rewards, terminated, truncated, final, over = self.inner.step(np.asarray(actions))
        if self.check_finite:
            require_finite_rows(obs, 0, "observation")
            require_finite_rows(rewards, 0, "reward")
        self.returns += rewards
        self.lengths += 1
        episodes = EndedEpisodes.none(self.num_envs)
        info: dict[str, Any] = {}
        if final is not None:
            ended = terminated | truncated
            for i in np.flatnonzero(ended) if self.check_finite else ():  # a truncation bootstraps from it
                require_finite_rows(final[i : i + 1], int(i), "final observation")
            info = {"final_obs": _object_rows(final, ended), "_final_obs": ended}
            if over.any():
                returns, lengths = np.where(over, self.returns, 0.0), np.where(over, self.lengths, 0)
                episodes = EndedEpisodes(over.copy(), returns, lengths)
                self.returns[over], self.lengths[over] = 0, 0
        if self.inner.clip:
            rewards = np.sign(rewards)
        return StepResult(obs, rewards, terminated, truncated, info, episodes)

    def check_alive(self) -> None:
        """Nothing to check: the envs live in this process."""

    def get_env_state(self) -> list[Any]:
        """One entry for the whole batch (its envs share arrays and an RNG); [None] when it cannot be saved."""
        state = self.inner.state()
        if state is None:
            return [None]
        episodes = {"returns": torch.from_numpy(self.returns.copy()), "lengths": torch.from_numpy(self.lengths.copy())}
        return [{"native": state, **episodes}]

    def set_env_state(self, state: list[Any]) -> None:
        (mine,) = state
        self.inner.load_state(mine["native"])
        self.returns, self.lengths = mine["returns"].numpy().copy(), mine["lengths"].numpy().copy()

    def close(self) -> None:
        self.inner.env.close()


def _object_rows(final: np.ndarray, ended: np.ndarray) -> np.ndarray:
    """info["final_obs"] as gymnasium's vector envs give it: an object array [N], each ended env's last observation."""
    rows = np.full(len(final), None, dtype=object)
    for i in np.flatnonzero(ended):
        rows[i] = final[i]
    return rows


def make_native(cfg: EnvConfig, atari: AtariConfig | None, num_envs: int, train: bool) -> NativeEnvs:
    """`num_envs` envs of `cfg` in their native vectorized implementation (check_native says which)."""
    if check_native(cfg, atari) == "ale":
        assert atari is not None
        return NativeEnvs(Atari(cfg, atari, num_envs, train, cfg.vector.num_workers), cfg.check_finite)
    return NativeEnvs(CartPole(cfg, num_envs), cfg.check_finite)


if TYPE_CHECKING:  # mypy holds this backend to the contracts it implements (rlrun/envs/protocol.py)
    from rlrun.envs.protocol import VectorEnv

    _vector_env: type[VectorEnv] = NativeEnvs
