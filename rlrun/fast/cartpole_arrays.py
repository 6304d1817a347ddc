"""In-process CartPoles stepped as arrays: a run's N envs, or a batch's S x N, moved by one numpy expression over all of
them instead of a Python step per env and wrapper. gymnasium's own vectorized CartPole (the native backend) resets
every env from one generator, so its episodes are not those of single envs; here each env keeps its objects (the
CartPoleEnv and its wrappers): its own generator resets it (through its wrappers, env.reset()), a checkpoint saves its
state, and every command but the step runs on it as before (rlrun/envs/sync.py's run_command).

The step is CartPoleEnv.step's arithmetic in the same order on float64 columns, so it gives the same numbers to the bit
(tests/unit/test_cartpole_arrays.py steps both side by side through SAME_STEP autoresets and time limits);
TimeLimit's and RecordEpisodeStatistics' counters are kept as arrays beside the state and written back to the env
objects before any other command reads them. As the other accelerations that re-write math (fast/selfcheck.py), a
run checks the arrays against the envs' own step on its first step and on the first step that ends an episode, and
steps its envs one by one from then on if anything differs."""

from __future__ import annotations

import copy
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.wrappers import OrderEnforcing, RecordEpisodeStatistics, TimeLimit

from rlrun.envs.state import env_state, load_env_state, wrapper_layers
from rlrun.envs.sync import RunCommand, autoreset, run_command
from rlrun.fast.selfcheck import steps_aside

# The wrappers rlrun puts on a CartPole (rlrun/envs/make_env), outermost first: the ones whose step this module writes.
LAYERS = (RecordEpisodeStatistics, TimeLimit, OrderEnforcing, CartPoleEnv)
PHYSICS = (
    "gravity",
    "masspole",
    "total_mass",
    "length",
    "polemass_length",
    "force_mag",
    "tau",
    "kinematics_integrator",
    "theta_threshold_radians",
    "x_threshold",
    "_sutton_barto_reward",
)


def _physics(env: gym.Env) -> tuple[Any, ...]:
    return (*(getattr(env.unwrapped, name) for name in PHYSICS), wrapper_layers(env)[1]._max_episode_steps)


def cartpole_layers(env: gym.Env) -> tuple[RecordEpisodeStatistics, TimeLimit, CartPoleEnv]:
    """The layers of a coverable env whose state the arrays keep: its statistics, its time limit, its physics."""
    stats, limit, _, cart = wrapper_layers(env)
    return stats, limit, cart


def coverable(envs: list[gym.Env]) -> bool:
    """Whether CartPoleArrays steps `envs`: all CartPoleEnvs wrapped exactly as rlrun wraps them (no other wrapper, no
    subclass), not rendering, with the same physics and time limit."""
    return (
        bool(envs)
        and all(tuple(map(type, wrapper_layers(e))) == LAYERS and e.unwrapped.render_mode is None for e in envs)
        and len({_physics(e) for e in envs}) == 1
    )


class CartPoleArrays:
    """The step of `envs` (coverable) as arrays. `rows(lo, hi)` is the run_command (SyncEnvs' part) of envs lo..hi-1:
    the step of all of them as arrays, every other command (and a step the arrays cannot take: before a reset, an
    invalid action, a non-finite state) by run_command on the env objects, brought up to date first."""

    NAME, REFERENCE = "CartPole as arrays", "gymnasium's CartPoleEnv.step"

    def __init__(self, envs: list[gym.Env]) -> None:
        self.envs, self.n = envs, len(envs)
        self.stats, self.limits, self.carts = (list(layers) for layers in zip(*map(cartpole_layers, envs), strict=True))
        self.p, self.max_steps = self.carts[0], self.limits[0]._max_episode_steps
        self.state = np.zeros((self.n, 4))  # CartPoleEnv.state: x, x_dot, theta, theta_dot
        self.elapsed = np.zeros(self.n, dtype=np.int64)  # TimeLimit._elapsed_steps
        self.returns = np.zeros(self.n)  # RecordEpisodeStatistics.episode_returns
        self.lengths = np.zeros(self.n, dtype=np.int64)  # RecordEpisodeStatistics.episode_lengths
        self.stale = np.ones(self.n, dtype=bool)  # rows whose env objects hold their state (made, reset, restored)
        self.any_stale = True
        self.forces = np.array([-self.p.force_mag, self.p.force_mag])
        self.thresholds = np.array([self.p.x_threshold, self.p.theta_threshold_radians])
        self.ahead = False  # whether the arrays hold steps the env objects have not been told of
        self.active, self.check_first, self.check_end = True, True, True  # the self-check's steps to come

    def rows(self, lo: int, hi: int) -> RunCommand:
        """run_command for envs lo..hi-1 of this object's, as a SyncEnvs of them runs it (offset 0 in its buffers)."""

        def run(
            command: str,
            data: list[Any] | None,
            envs: list[gym.Env],
            offset: int,
            b: dict[str, np.ndarray],
            where: list[int | None],
            check_finite: bool = True,
        ) -> list[dict[str, Any]]:
            if command == "step" and (lo, hi) == (0, self.n):
                infos = self.step(b, check_finite)
                if infos is not None:
                    return infos
            self.write_back()
            infos = run_command(command, data, envs, offset, b, where, check_finite)
            self.stale[lo:hi] = self.any_stale = True
            return infos

        return run

    def write_back(self, objects: list[gym.Env] | None = None) -> None:
        """The arrays' state and counters into the env objects (`objects`: copies of them instead)."""
        if not self.ahead and objects is None:
            return
        for i, env in enumerate(objects or self.envs):
            if not self.stale[i]:
                stats, limit, cart = cartpole_layers(env)
                cart.state = self.state[i].copy()
                limit._elapsed_steps = int(self.elapsed[i])  # type: ignore[assignment]  # typeshed: None until reset
                stats.episode_returns, stats.episode_lengths = float(self.returns[i]), int(self.lengths[i])
        if objects is None:
            self.ahead = False

    def _load(self, i: int) -> None:
        self.state[i], self.elapsed[i] = self.carts[i].state, self.limits[i]._elapsed_steps
        self.returns[i], self.lengths[i] = self.stats[i].episode_returns, self.stats[i].episode_lengths
        self.stale[i] = False

    def _can_step(self, actions: np.ndarray) -> bool:
        """Whether the arrays take this step: every env reset (so its state is loaded) and every action 0 or 1."""
        # x >> 1 is 0 for 0 and 1 only. (np.count_nonzero, np.logical_or.reduce: C calls where ndarray.any() and
        # .all() pass through Python, 2-5 us each at a few envs: a tenth of this step.)
        if not self.active or actions.dtype.kind not in "iu" or np.count_nonzero(actions >> 1):
            return False
        if self.any_stale:
            for i in map(int, np.flatnonzero(self.stale)):
                if self.carts[i].state is None or self.limits[i]._elapsed_steps is None:
                    return False
                self._load(i)
            self.any_stale = False
        return True

    def step(self, b: dict[str, np.ndarray], check_finite: bool) -> list[dict[str, Any]] | None:
        """All envs stepped with b["actions"] into `b` (rows 0..n-1), with SAME_STEP autoreset; their infos, or None
        when the arrays cannot take this step (the env objects, up to date, step it instead)."""
        actions = b["actions"]
        if not self._can_step(actions):
            return None
        new = self.physics(actions)
        obs = new.astype(np.float32)  # CartPoleEnv's observation
        if np.count_nonzero(np.isfinite(obs)) < obs.size:  # the envs' own step says which env, as without the arrays
            return None
        # x < -threshold or x > threshold, for x and theta (columns 0 and 2): |x| > threshold is the same test.
        terminated = np.logical_or.reduce(np.abs(new[:, ::2]) > self.thresholds, axis=1)
        truncated = self.elapsed >= self.max_steps - 1  # TimeLimit's count, one step on
        ended = terminated | truncated
        any_ended = bool(np.count_nonzero(ended))
        reference = self._reference_copies(first_end=any_ended)
        self.state[:] = new
        b["obs"][:] = obs
        infos = self._record(b, terminated, truncated)
        if any_ended:
            for i in map(int, np.flatnonzero(ended)):
                infos[i] = self._end_episode(i, b, check_finite)
        if reference is not None:
            infos = self._check(reference, b, infos, check_finite)
        return infos

    def physics(self, actions: np.ndarray) -> np.ndarray:
        """CartPoleEnv.step's state update, row by row: the same operations in the same order on columns."""
        p, s = self.p, self.state
        x, x_dot, theta, theta_dot = s.T
        force = self.forces[actions]  # force_mag if action == 1 else -force_mag
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + p.polemass_length * np.square(theta_dot) * sintheta) / p.total_mass
        thetaacc = (p.gravity * sintheta - costheta * temp) / (
            p.length * (4.0 / 3.0 - p.masspole * np.square(costheta) / p.total_mass)
        )
        xacc = temp - p.polemass_length * thetaacc * costheta / p.total_mass
        if p.kinematics_integrator == "euler":  # each variable + tau * its derivative, all four in one expression
            # np.array(...).T: np.stack's columns, without its Python-level checks (half this step's time for few envs)
            new: np.ndarray = s + p.tau * np.array((x_dot, xacc, theta_dot, thetaacc)).T
            return new
        x_dot = x_dot + p.tau * xacc  # semi-implicit euler
        x = x + p.tau * x_dot
        theta_dot = theta_dot + p.tau * thetaacc
        theta = theta + p.tau * theta_dot
        semi_implicit: np.ndarray = np.array((x, x_dot, theta, theta_dot)).T.copy()
        return semi_implicit

    def _record(self, b: dict[str, np.ndarray], terminated: np.ndarray, truncated: np.ndarray) -> list[dict[str, Any]]:
        """The step's outputs into `b`, as CartPoleEnv, TimeLimit and RecordEpisodeStatistics give them, and the
        counters moved on; the infos of envs whose episode goes on."""
        if self.p._sutton_barto_reward:  # under SAME_STEP autoreset every termination is the pole's first fall
            reward: np.ndarray | float = np.where(terminated, -1.0, 0.0)
        else:
            reward = 1.0
        self.elapsed += 1
        self.returns += reward
        self.lengths += 1
        b["rewards"][:], b["terminated"][:], b["truncated"][:] = reward, terminated, truncated
        self.ahead = True
        return [{}] * self.n

    def _end_episode(self, i: int, b: dict[str, np.ndarray], check_finite: bool) -> dict[str, Any]:
        """RecordEpisodeStatistics' end of env i's episode, then its autoreset (the env's own reset); its info."""
        stats = self.stats[i]
        r, length = float(self.returns[i]), int(self.lengths[i])
        t = round(time.perf_counter() - stats.episode_start_time, 6)
        stats.time_queue.append(t)
        stats.return_queue.append(r)
        stats.length_queue.append(length)
        stats.episode_count += 1
        stats.episode_start_time = time.perf_counter()
        episode = {"episode": {"r": r, "l": length, "t": t}}
        b["obs"][i], info = autoreset(stats, b["obs"][i].copy(), episode, b["final_obs"][i], i, check_finite)
        self._load(i)  # the reset state, counters at 0
        return info

    def _reference_copies(self, first_end: bool) -> list[gym.Env] | None:
        """On the self-check's steps (the first, and the first that ends an episode, `first_end`, so that the end, the
        statistics and the reset are compared too): copies of the env objects as they stand before the step."""
        if not (self.check_first or (first_end and self.check_end)):
            return None
        self.check_first, self.check_end = False, self.check_end and not first_end
        copies = copy.deepcopy(self.envs)
        self.write_back(copies)
        return copies

    def _check(
        self, reference: list[gym.Env], b: dict[str, np.ndarray], infos: list[dict[str, Any]], check_finite: bool
    ) -> list[dict[str, Any]]:
        """The self-check of this step: `reference` (the envs as they were) stepped by their own step, compared with
        the arrays' outputs, infos and state. Where they differ the env objects take the reference's state and its
        outputs, and the arrays step aside for the rest of the run. The infos to return."""
        ended = b["terminated"] | b["truncated"]
        ours = {k: v.copy() for k, v in b.items()}
        ref_infos = run_command("step", None, reference, 0, b, [0], check_finite)
        diff = max(output_difference(ours[k][rows], b[k][rows]) for k, rows in _compared(ended))
        diff = max(diff, _episodes_difference(infos, ref_infos))
        self.write_back()
        diff = max(diff, *(state_difference(env, ref) for env, ref in zip(self.envs, reference)))
        if not steps_aside(self.NAME, self.REFERENCE, diff, tolerance=0.0):
            for k, v in ours.items():
                b[k][:] = v
            return infos
        self.active = False
        for env, ref in zip(self.envs, reference):
            state = env_state(ref)
            assert state is not None  # classic control's state is all plain data (rlrun/envs/state.py)
            load_env_state(env, state)
        self.stale[:] = self.any_stale = True
        return ref_infos


def _compared(ended: np.ndarray) -> list[tuple[str, Any]]:
    """The step's outputs the check compares, with the rows where they mean something."""
    return [
        ("obs", slice(None)),
        ("rewards", slice(None)),
        ("terminated", slice(None)),
        ("truncated", slice(None)),
        ("final_obs", ended),
    ]


def output_difference(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.dtype == np.bool_ or b.dtype == np.bool_:
        return 0.0 if np.array_equal(a, b) else float("inf")
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0.0))


def _episodes_difference(ours: list[dict[str, Any]], reference: list[dict[str, Any]]) -> float:
    """inf where the episodes that ended, or their returns and lengths, differ (their wall times may)."""

    def episodes(infos: list[dict[str, Any]]) -> list[Any]:
        return [(e["r"], e["l"]) if (e := i.get("final_info", {}).get("episode")) else None for i in infos]

    return 0.0 if episodes(ours) == episodes(reference) else float("inf")


def state_difference(env: gym.Env, reference: gym.Env) -> float:
    """How far `env`'s state is from `reference`'s: the physics' largest difference; inf where a counter or the
    generator differs."""
    (stats, limit, cart), (ref_stats, ref_limit, ref_cart) = cartpole_layers(env), cartpole_layers(reference)
    counters = ("episode_returns", "episode_lengths", "episode_count", "return_queue", "length_queue")
    same = all(getattr(stats, name) == getattr(ref_stats, name) for name in counters)
    same = same and limit._elapsed_steps == ref_limit._elapsed_steps
    same = same and cart.np_random.bit_generator.state == ref_cart.np_random.bit_generator.state
    return output_difference(np.asarray(cart.state), np.asarray(ref_cart.state)) if same else float("inf")
