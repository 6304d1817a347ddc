"""The native backend (env.vector.backend=native): the vectorized implementation an env's own package ships, behind
rlrun's VectorEnv contract: gymnasium's numpy CartPoleVectorEnv (CartPole's vector entry point) and ale-py's
AtariVectorEnv (C++ threads doing the standard Atari preprocessing). tests/unit/test_native_envs.py states where
their episodes differ from those of the Python wrappers the other backends step (README: "Native vector envs")."""

from __future__ import annotations

import os
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
    """A vectorized implementation as NativeEnvs steps it: send actions, then receive the step (which may run in the
    implementation's own threads in between)."""

    clip: bool  # rewards go to the algorithm as their sign
    threads: int  # its own, stepping the envs (0: it steps in the caller's)

    @property
    def env(self) -> gym.vector.VectorEnv: ...

    def reset(self, seeds: list[int] | None) -> tuple[np.ndarray, dict[str, Any]]: ...
    def send(self, actions: np.ndarray) -> None: ...
    def recv(self) -> Stepped: ...
    def state(self) -> dict[str, Any] | None: ...  # plain data, or None when it cannot be saved
    def load_state(self, state: dict[str, Any]) -> None: ...


class CartPole:
    """gymnasium's CartPoleVectorEnv, which restarts a finished episode at the next step (NEXT_STEP: that step ignores
    its action and returns reward 0), restarting it in the step that ends it instead, with the draws from its RNG
    that its own restart would make. Its state is plain arrays and an RNG: runs resume exactly."""

    clip, threads = False, 0

    def __init__(self, cfg: EnvConfig, num_envs: int):
        kwargs = dict(cfg.kwargs)
        if cfg.max_episode_steps is not None:  # in agent steps, as TimeLimit counts them
            kwargs["max_episode_steps"] = cfg.max_episode_steps
        env = gym.make_vec(cfg.id, num_envs, vectorization_mode="vector_entry_point", **kwargs)
        assert isinstance(env, CartPoleVectorEnv) and env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        self.env: CartPoleVectorEnv = env
        self.actions = np.zeros(num_envs, np.int64)

    def reset(self, seeds: list[int] | None) -> tuple[np.ndarray, dict[str, Any]]:
        # One RNG draws every env's start state: the first env's seed seeds it (the others are its stream's too).
        return self.env.reset(seed=None if seeds is None else seeds[0])

    def send(self, actions: np.ndarray) -> None:
        self.actions = actions

    def recv(self) -> Stepped:
        obs, rewards, terminated, truncated, _ = self.env.step(self.actions)
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
        self.threads = threads
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

    def send(self, actions: np.ndarray) -> None:
        self.env.send(actions)  # its threads step while this one goes on

    def recv(self) -> Stepped:
        obs, rewards, terminated, truncated, info = self.env.recv()
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
    """The VectorEnv of vectorized implementations (`parts`, each the envs of one group, in order): SAME_STEP steps,
    each finished episode's last observation in info["final_obs"], the episodes' statistics as
    RecordEpisodeStatistics counts them (raw return and agent steps), and with `check_finite`, a NaN or infinite
    observation or reward ends the run naming the env. With two parts a collect loop acts for one while the other
    steps in its threads (env.vector.double_buffer)."""

    def __init__(self, parts: list[Inner], check_finite: bool = True):
        self.parts, self.check_finite = parts, check_finite
        env = parts[0].env
        sizes = np.cumsum([0] + [p.env.num_envs for p in parts])
        self.groups = [slice(int(a), int(b)) for a, b in zip(sizes[:-1], sizes[1:])]
        self.num_envs = int(sizes[-1])
        # Its threads (ALE games'), which step while the rank acts for the other group or waits: acting takes the
        # other cores, or OpenMP threads spinning after each forward would slow the envs' threads down.
        self.num_workers = sum(p.threads for p in parts)
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = env.metadata
        self.returns = np.zeros(self.num_envs)  # of the episodes under way
        self.lengths = np.zeros(self.num_envs, np.int64)
        # Per group: views of those, and what a step in which no episode ended returns (read-only, so shared).
        self._episodes = [(self.returns[g], self.lengths[g]) for g in self.groups]
        self._none = [EndedEpisodes.none(len(range(self.num_envs)[g])) for g in self.groups]
        for none in self._none:
            for array in none:
                array.flags.writeable = False

    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        seeds = [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else seed
        resets = [p.reset(None if seeds is None else list(seeds[g])) for p, g in zip(self.parts, self.groups)]
        obs = np.concatenate([o for o, _ in resets])
        self.returns[:], self.lengths[:] = 0, 0
        if self.check_finite:
            require_finite_rows(obs, 0, "observation")
        info = {k: np.concatenate([i[k] for _, i in resets]) for k in resets[0][1]}
        return obs, info

    def send(self, group: int, actions: np.ndarray) -> None:
        self.parts[group].send(np.asarray(actions))

    def recv(self, group: int) -> StepResult:
        g = self.groups[group]
        obs, rewards, terminated, truncated, final, over = self.parts[group].recv()
        if self.check_finite:
            require_finite_rows(obs, g.start, "observation")
            require_finite_rows(rewards, g.start, "reward")
        returns, lengths = self._episodes[group]
        returns += rewards
        lengths += 1
        episodes = self._none[group]
        info: dict[str, Any] = {}
        if final is not None:
            ended = terminated | truncated
            for i in np.flatnonzero(ended) if self.check_finite else ():  # a truncation bootstraps from it
                require_finite_rows(final[i : i + 1], g.start + int(i), "final observation")
            info = {"final_obs": _object_rows(final, ended), "_final_obs": ended}
            if over.any():
                episodes = EndedEpisodes(over.copy(), np.where(over, returns, 0.0), np.where(over, lengths, 0))
                returns[over], lengths[over] = 0, 0
        if self.parts[group].clip:
            rewards = np.sign(rewards)
        return StepResult(obs, rewards, terminated, truncated, info, episodes)

    def step(self, actions: np.ndarray) -> StepResult:
        if len(self.groups) == 1:
            self.send(0, actions)
            return self.recv(0)
        for i, g in enumerate(self.groups):
            self.send(i, actions[g])
        results = [self.recv(i) for i in range(len(self.groups))]
        infos = [r.info for r in results]
        info = {}
        if any(infos):
            rows = [x.get("_final_obs", np.zeros(len(r.obs), bool)) for x, r in zip(infos, results)]
            finals = [x.get("final_obs", np.full(len(r.obs), None, object)) for x, r in zip(infos, results)]
            info = {"final_obs": np.concatenate(finals), "_final_obs": np.concatenate(rows)}
        obs, rewards, terminated, truncated = (np.concatenate(f) for f in zip(*(r[:4] for r in results)))
        return StepResult(
            obs, rewards, terminated, truncated, info, EndedEpisodes.joined([r.episodes for r in results])
        )

    def check_alive(self) -> None:
        """Nothing to check: the envs live in this process."""

    def get_env_state(self) -> list[Any]:
        """One entry per group (its envs share arrays and an RNG); None for a group that cannot be saved."""
        out: list[Any] = []
        for part, g in zip(self.parts, self.groups):
            state = part.state()
            episodes = {
                "returns": torch.from_numpy(self.returns[g].copy()),
                "lengths": torch.from_numpy(self.lengths[g].copy()),
            }
            out.append(None if state is None else {"native": state, **episodes})
        return out

    def set_env_state(self, state: list[Any]) -> None:
        for part, g, mine in zip(self.parts, self.groups, state, strict=True):
            part.load_state(mine["native"])
            self.returns[g], self.lengths[g] = mine["returns"].numpy(), mine["lengths"].numpy()

    def close(self) -> None:
        for part in self.parts:
            part.env.close()


def _object_rows(final: np.ndarray, ended: np.ndarray) -> np.ndarray:
    """info["final_obs"] as gymnasium's vector envs give it: an object array [N], each ended env's last observation."""
    rows = np.full(len(final), None, dtype=object)
    for i in np.flatnonzero(ended):
        rows[i] = final[i]
    return rows


def make_native(cfg: EnvConfig, atari: AtariConfig | None, num_envs: int, train: bool) -> NativeEnvs:
    """`num_envs` envs of `cfg` in their native vectorized implementation (check_native says which); for training
    with env.vector.double_buffer, in two halves, each with its share of the threads."""
    kind, v = check_native(cfg, atari), cfg.vector
    groups = 2 if v.double_buffer and train else 1
    sizes = [len(s) for s in np.array_split(np.arange(num_envs), groups)]
    if kind == "ale":
        assert atari is not None
        threads = max(1, (v.num_workers or os.cpu_count() or 1) // groups)
        return NativeEnvs([Atari(cfg, atari, n, train, min(n, threads)) for n in sizes], cfg.check_finite)
    return NativeEnvs([CartPole(cfg, n) for n in sizes], cfg.check_finite)


if TYPE_CHECKING:  # mypy holds this backend to the contracts it implements (rlrun/envs/protocol.py)
    from rlrun.envs.protocol import VectorEnv

    _vector_env: type[VectorEnv] = NativeEnvs
