"""A few in-process CartPoles (fewer than stepping them as arrays pays for: rlrun/fast/cartpole_arrays.py) stepped in
Python floats on their own env objects: CartPoleEnv.step's arithmetic in the same order (np.cos and np.sin as it calls
them), TimeLimit's and RecordEpisodeStatistics' counters moved on, without the call through three wrappers per env,
the action space's check and the lists the vector step gathers its outputs in. With one env, those were about half of
the vector step.

Only steps that end no episode are taken here. A step that would end one (a fall or the time limit), an action other
than 0 or 1, an env not yet reset, or a state that is not finite is left whole to the envs' own step (SyncEnvs'
run_command), with nothing touched: every end of episode, autoreset, statistic and error is theirs. The env objects
hold the state at every step, so every other command (a reset, a checkpoint's state, a restore) runs on them as before.
As the other accelerations that re-write math (fast/selfcheck.py), a run checks the first step taken here against the
envs' own step on copies of them, to the bit, and leaves every step to the envs from then on if anything differs."""

from __future__ import annotations

import copy
import math
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.envs.state import env_state, load_env_state, wrapper_layers
from rlrun.envs.sync import run_command
from rlrun.fast.cartpole_arrays import cartpole_layers, output_difference, state_difference
from rlrun.fast.selfcheck import steps_aside

Physics = tuple[float, float, float, float]  # CartPoleEnv.state: x, x_dot, theta, theta_dot


class CartPoleFloats:
    """SyncEnvs' run_command for coverable CartPoles (cartpole_arrays.coverable)."""

    NAME, REFERENCE = "CartPole stepped in floats", "gymnasium's CartPoleEnv.step"

    def __init__(self, envs: list[gym.Env]) -> None:
        self.envs = envs
        self.layers = [cartpole_layers(e) for e in envs]  # (RecordEpisodeStatistics, TimeLimit, CartPoleEnv) of each
        self.orders = [wrapper_layers(e)[2] for e in envs]  # OrderEnforcing: stepped only once reset
        self.reward = 0.0 if self.layers[0][2]._sutton_barto_reward else 1.0  # CartPole's reward while upright
        self.active, self.checked = True, False

    def __call__(
        self,
        command: str,
        data: list[Any] | None,
        envs: list[gym.Env],
        offset: int,
        b: dict[str, np.ndarray],
        where: list[int | None],
        check_finite: bool = True,
    ) -> list[dict[str, Any]]:
        new = self.physics(b["actions"]) if command == "step" and self.active else None
        if new is None:
            return run_command(command, data, envs, offset, b, where, check_finite)
        if self.checked:
            return self.take(new, b)
        return self.check(new, b, check_finite)

    def physics(self, actions: np.ndarray) -> list[Physics] | None:
        """Each env's state after CartPoleEnv.step with `actions`, or None when any env's step is not one taken here."""
        if actions.dtype.kind not in "iu":
            return None
        new: list[Physics] = []
        for a, (_, limit, cart), order in zip(actions.tolist(), self.layers, self.orders, strict=True):
            elapsed = limit._elapsed_steps
            if a not in (0, 1) or cart.state is None or elapsed is None or not order._has_reset:
                return None
            if elapsed + 1 >= limit._max_episode_steps:  # the time limit ends the episode
                return None
            x, x_dot, theta, theta_dot = cart.state.tolist()
            force = cart.force_mag if a == 1 else -cart.force_mag
            costheta, sintheta = float(np.cos(theta)), float(np.sin(theta))
            temp = (force + cart.polemass_length * (theta_dot * theta_dot) * sintheta) / cart.total_mass
            thetaacc = (cart.gravity * sintheta - costheta * temp) / (
                cart.length * (4.0 / 3.0 - cart.masspole * (costheta * costheta) / cart.total_mass)
            )
            xacc = temp - cart.polemass_length * thetaacc * costheta / cart.total_mass
            if cart.kinematics_integrator == "euler":
                x, x_dot = x + cart.tau * x_dot, x_dot + cart.tau * xacc
                theta, theta_dot = theta + cart.tau * theta_dot, theta_dot + cart.tau * thetaacc
            else:  # semi-implicit euler
                x_dot = x_dot + cart.tau * xacc
                x = x + cart.tau * x_dot
                theta_dot = theta_dot + cart.tau * thetaacc
                theta = theta + cart.tau * theta_dot
            state = (x, x_dot, theta, theta_dot)
            if not all(map(math.isfinite, state)):  # the envs' own step says which env, as without this
                return None
            x_limit, theta_limit = cart.x_threshold, cart.theta_threshold_radians
            if x < -x_limit or x > x_limit or theta < -theta_limit or theta > theta_limit:  # it fell: the episode ends
                return None
            new.append(state)
        return new

    def take(self, new: list[Physics], b: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        """The step to `new` into the env objects and the buffers `b`; the envs' infos (none: no episode ended)."""
        for (stats, limit, cart), state in zip(self.layers, new, strict=True):
            cart.state = np.array(state, dtype=np.float64)
            limit._elapsed_steps += 1  # type: ignore[operator, assignment]  # typeshed: None until reset (checked)
            stats.episode_returns += self.reward
            stats.episode_lengths += 1
        b["obs"][:] = new  # float64 to float32, as CartPoleEnv's np.array(self.state, dtype=np.float32)
        b["rewards"][:], b["terminated"][:], b["truncated"][:] = self.reward, False, False
        return [{} for _ in new]

    def check(self, new: list[Physics], b: dict[str, np.ndarray], check_finite: bool) -> list[dict[str, Any]]:
        """The first step taken here, against the envs' own step on copies of them: the same outputs, infos and state,
        or the copies' step and state for the env objects and every step left to the envs from now on."""
        self.checked = True
        reference, ref_b = copy.deepcopy(self.envs), {k: v.copy() for k, v in b.items()}
        ref_infos = run_command("step", None, reference, 0, ref_b, [0], check_finite)
        infos = self.take(new, b)
        diff = max(output_difference(b[k], ref_b[k]) for k in ("obs", "rewards", "terminated", "truncated"))
        diff = max(diff, 0.0 if ref_infos == infos else math.inf)
        diff = max(diff, *(state_difference(env, ref) for env, ref in zip(self.envs, reference, strict=True)))
        if not steps_aside(self.NAME, self.REFERENCE, diff, tolerance=0.0):
            return infos
        self.active = False
        for env, ref in zip(self.envs, reference, strict=True):
            state = env_state(ref)
            assert state is not None  # classic control's state is all plain data (rlrun/envs/state.py)
            load_env_state(env, state)
        for k, v in ref_b.items():
            b[k][:] = v
        return ref_infos
