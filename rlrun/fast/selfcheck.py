"""The self-check of the accelerations that re-write the math (the fused PPO and DQN losses, DQN's fused targets, the
fused A2C unroll, PPO's and DQN's gradient steps in numpy, SAC's and TD3's steps without autograd, numpy acting, and
their counterparts for a batch of PPO seeds): at its first use in a process (a run's first update or first act, and so
again after every resume), each runs beside the reference part it replaces on the same inputs and compares what comes
out. Beyond TOLERANCE it steps aside for the rest of the run, with one log line naming it and the size of the
difference, and the reference runs, so an edit to algos/ or models/ is what trains. A check that passes changes nothing:
it draws no random numbers (acting restores torch's generator; a gradient step's check puts the parameters and the
optimizer's state back before the fast step) and the accelerated part's results are the ones used, computed as without
the check."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.batched_ppo import BatchedActing, DrawNoise
from rlrun.algos.parts import Acting
from rlrun.fast.flat_adam import FlatAdam, flat_views

log = logging.getLogger("rlrun")

# float32 sums in another order (a fused gradient, numpy's matmul) differ from autograd's by about 1e-6 of the
# quantity; 1e-4 leaves a hundredfold margin over that rounding and still catches an edit that moves a loss, a
# gradient or a log-prob by a ten-thousandth of its size.
TOLERANCE = 1e-4


def difference(fast: Tensor | None, reference: Tensor | None, floor: float = 1.0) -> float:
    """max |fast - reference| / max(max |reference|, floor): relative where the reference is large, absolute under
    `floor`. None (a parameter a computation does not reach, so no gradient) counts as zeros."""
    if fast is None:
        if reference is None:
            return 0.0
        fast = torch.zeros_like(reference)
    if reference is None:
        reference = torch.zeros_like(fast)
    fast, reference = fast.detach(), reference.detach()
    if fast.shape != reference.shape:
        return float("inf")
    scale = max(float(reference.abs().max()) if reference.numel() else 0.0, floor)
    return float((fast.double() - reference.double()).abs().max()) / scale if fast.numel() else 0.0


def gradients(loss: Tensor, params: Sequence[nn.Parameter], keep: bool = False) -> tuple[Tensor | None, ...]:
    """d loss / d params without touching .grad (so DDP's hooks and the optimizer see nothing); None where the loss
    does not reach a parameter. `keep`: the graph stays for the backward that follows."""
    return torch.autograd.grad(loss, list(params), retain_graph=keep, allow_unused=True)


def gradient_difference(fast: Sequence[Tensor | None], reference: Sequence[Tensor | None]) -> float:
    """The largest difference of one parameter's gradients, relative to that gradient's largest entry."""
    return max((difference(a, b, floor=1e-6) for a, b in zip(fast, reference, strict=True)), default=0.0)


def steps_aside(name: str, reference: str, diff: float, tolerance: float = TOLERANCE) -> bool:
    """Whether `name` steps aside at this difference from `reference`; if so, it says so in one line. `tolerance`: 0
    for a part that must give the reference's numbers to the bit."""
    if not diff <= tolerance:  # also when the difference is NaN
        log.warning("%s differs from %s by %.1e: running the reference", name, reference, diff)
        return True
    return False


class CheckedLearner(nn.Module):
    """PPO's learner (forward(**minibatch) -> (loss, stats)): the fused loss, checked against the reference
    learner on the first minibatch it gets, and the reference for the rest of the run if they differ. Also a batch
    of seeds' (BatchedPPOLearner: a loss per seed [S], whose sum's gradient is checked), under its own names."""

    def __init__(
        self,
        fast: nn.Module,
        reference: nn.Module,
        params: list[nn.Parameter],
        names: tuple[str, str] = ("fused PPO loss", "algos/ppo.py"),
    ):
        super().__init__()
        self.fast, self.reference, self.params = fast, reference, params
        self.NAME, self.REFERENCE = names
        self.active, self.checked = fast, False

    def forward(self, **minibatch: Tensor) -> tuple[Tensor, Tensor]:
        if not self.checked:
            self.checked = True
            if steps_aside(self.NAME, self.REFERENCE, self.difference(minibatch)):
                self.active = self.reference
        result: tuple[Tensor, Tensor] = self.active(**minibatch)
        return result

    def difference(self, minibatch: dict[str, Tensor]) -> float:
        """The largest difference in loss, stats and gradients, on the minibatch and on a probe of it whose old
        log-probs and values are moved off by fixed steps: at the first update every ratio is 1 and every value its
        old one, so the clipped branches (and an edit to them) would not show on the minibatch alone."""
        old = minibatch["old_log_probs"]
        steps = (torch.arange(old.numel(), device=old.device) % 3 - 1).float().view_as(old)  # -1, 0, 1, ...
        probe = minibatch | {
            "old_log_probs": minibatch["old_log_probs"] + 0.3 * steps,
            "old_values": minibatch["old_values"] + 0.5 * steps,
        }
        return max(self._difference(minibatch), self._difference(probe))

    def _difference(self, minibatch: dict[str, Tensor]) -> float:
        loss, stats = self.fast(**minibatch)
        ref_loss, ref_stats = self.reference(**minibatch)
        outputs = max(difference(loss, ref_loss), difference(stats, ref_stats))
        fast_grads, ref_grads = gradients(loss.sum(), self.params), gradients(ref_loss.sum(), self.params)
        return max(outputs, gradient_difference(fast_grads, ref_grads))


A = TypeVar("A", Acting, BatchedActing)
R = TypeVar("R")


def on_the_same_draws(reference: Callable[[], R], fast: Callable[[], R]) -> tuple[R, R, Tensor]:
    """(reference(), fast(), torch's generator state as the reference left it): the fast part draws from where the
    reference started, so both act on the same noise, and the generator is then where the fast part left it."""
    before = torch.get_rng_state()
    expected = reference()
    after_reference = torch.get_rng_state()
    torch.set_rng_state(before)
    return expected, fast(), after_reference


class _CheckedActing(Generic[A]):
    """What the checked acting parts share: the check itself, on the first outputs (of act or value)."""

    NAME, REFERENCE = "", ""

    def __init__(self, fast: A, reference: A):
        self.fast: A = fast
        self.reference: A = reference
        self.active: A = fast
        self.checked = False

    def _agrees(self, ours: tuple[Tensor, ...], expected: tuple[Tensor, ...]) -> bool:
        """Whether the fast part stays, after its check on these outputs."""
        self.checked = True
        diff = max(difference(a.double(), b.double()) for a, b in zip(ours, expected, strict=True))
        if steps_aside(self.NAME, self.REFERENCE, diff):
            self.active = self.reference
        return self.active is self.fast


class CheckedPolicy(_CheckedActing[Acting]):
    """PPO's acting part (.act, .value): numpy acting, checked against the model's act on the first observations
    it acts on (the same noise: torch's generator is put back between the two), and the model for the rest of the
    run if their actions, log-probs or values differ."""

    NAME, REFERENCE = "numpy acting", "models/ (ActorCritic.act)"

    def act(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.checked:
            return self.active.act(obs)
        expected, ours, after_reference = on_the_same_draws(lambda: self.reference.act(obs), lambda: self.fast.act(obs))
        if self._agrees(ours, expected):
            return ours
        torch.set_rng_state(after_reference)  # the generator as the reference left it: the reference's run
        return expected

    def value(self, obs: Tensor) -> Tensor:
        if self.checked:
            return self.active.value(obs)
        # Values asked before any action: the rollout acts elsewhere (env workers) and only bootstraps here.
        ours, expected = self.fast.value(obs), self.reference.value(obs)
        return ours if self._agrees((ours,), (expected,)) else expected


class CheckedExploration:
    """SAC's and TD3's exploration part (a vector step's observations -> their exploring actions): numpy acting, checked
    against the reference part on the first observations it acts on (the same noise: torch's generator is put back
    between the two), and the reference for the rest of the run if their actions differ."""

    NAME, REFERENCE = "numpy exploration", "algos/ (unit_actions) and models/continuous.py"

    def __init__(self, fast: Callable[[np.ndarray], np.ndarray], reference: Callable[[np.ndarray], np.ndarray]):
        self.fast, self.reference = fast, reference
        self.active, self.checked = fast, False

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if self.checked:
            return self.active(obs)
        self.checked = True
        expected, ours, after_reference = on_the_same_draws(lambda: self.reference(obs), lambda: self.fast(obs))
        if not steps_aside(self.NAME, self.REFERENCE, difference(torch.from_numpy(ours), torch.from_numpy(expected))):
            return ours
        self.active = self.reference
        torch.set_rng_state(after_reference)  # the generator as the reference left it: the reference's run
        return expected


class CheckedBatchedPolicy(_CheckedActing[BatchedActing]):
    """A batch of seeds' acting part (BatchedActing: .act with the seeds' noise, .value): numpy acting, checked against
    the stacked model on the first observations it acts on or values (the noise is given, so both draw nothing), and
    the model for the rest of the run if their actions, log-probs or values differ."""

    NAME, REFERENCE = "batched numpy acting", "algos/batched_ppo.py (BatchedActorCritic.act)"

    def act(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.checked:
            return self.active.act(obs, noise)
        ours, expected = self.fast.act(obs, noise), self.reference.act(obs, noise)
        return ours if self._agrees(ours, expected) else expected

    def value(self, obs: Tensor) -> Tensor:
        if self.checked:
            return self.active.value(obs)
        ours, expected = self.fast.value(obs), self.reference.value(obs)
        return ours if self._agrees((ours,), (expected,)) else expected


class CheckedDQNLearner(nn.Module):
    """DQN's learner (forward(obs, actions, targets, weights) -> (loss, |TD errors|, Q)): the fused loss, checked
    against the reference learner on the first batch it gets, and the reference for the rest of the run if they
    differ."""

    NAME, REFERENCE = "fused DQN loss", "algos/dqn.py (DQNLearner)"

    def __init__(self, fast: nn.Module, reference: nn.Module, params: list[nn.Parameter]):
        super().__init__()
        self.fast, self.reference, self.params = fast, reference, params
        self.active, self.checked = fast, False

    def forward(self, obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if not self.checked:
            self.checked = True
            if steps_aside(self.NAME, self.REFERENCE, self.difference(obs, actions, targets, weights)):
                self.active = self.reference
        result: tuple[Tensor, Tensor, Tensor] = self.active(obs, actions, targets, weights)
        return result

    def difference(self, obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor) -> float:
        """The largest difference in outputs and gradients, on the batch and on a probe of it whose targets are
        moved by fixed steps of 2 and whose weights are unequal: uniform replay's weights are all 1, and a first
        batch's errors may all be small (Huber's linear branch, and an edit to it, would not show)."""
        steps = (torch.arange(len(targets), device=targets.device) % 3 - 1).float()  # -1, 0, 1, ...
        probe = (obs, actions, targets + 2.0 * steps, weights * (1.0 + 0.5 * steps))
        return max(self._difference((obs, actions, targets, weights)), self._difference(probe))

    def _difference(self, batch: tuple[Tensor, Tensor, Tensor, Tensor]) -> float:
        fast, reference = self.fast(*batch), self.reference(*batch)
        outputs = max(difference(a, b) for a, b in zip(fast, reference, strict=True))
        grads = gradient_difference(gradients(fast[0], self.params), gradients(reference[0], self.params))
        return max(outputs, grads)


class CheckedQTargets:
    """DQN's targets part ((next_obs, returns, discount) -> targets): the fused forward passes, checked against the
    reference's on the first call, and again on the first call where the online and target networks choose different
    actions for some of the batch (while they choose alike, as at the first update, double DQN's choice, and an edit to
    it, would not show), looked for over the first LOOK calls (two small forward passes each); the reference for the
    rest of the run if they differ."""

    NAME, REFERENCE = "fused DQN targets", "algos/dqn.py (q_targets)"
    LOOK = 500

    def __init__(self, fast: Any, reference: Callable[[Tensor, Tensor, Tensor], Tensor]):
        self.fast, self.reference = fast, reference
        self.active, self.calls = fast, 0

    def __call__(self, next_obs: Tensor, returns: Tensor, discount: Tensor) -> Tensor:
        if self.calls < self.LOOK:
            self.calls += 1
            parted = not self.fast.choices_agree(next_obs)
            if parted or self.calls == 1:
                ours, expected = self.fast(next_obs, returns, discount), self.reference(next_obs, returns, discount)
                if steps_aside(self.NAME, self.REFERENCE, difference(ours, expected)):
                    self.active, parted = self.reference, True
            if parted:
                self.calls = self.LOOK
        result: Tensor = self.active(next_obs, returns, discount)
        return result


class CheckedEpsilonGreedy:
    """DQN's acting part ((obs, explore, random) -> actions): numpy acting, checked on the first observations it acts on
    against the reference part, on that step's noise and with no env exploring (at first every env explores, and the
    greedy choice would not show), and its Q-values against the model's; the reference for the rest of the run if any
    differ."""

    NAME, REFERENCE = "numpy epsilon-greedy acting", "algos/dqn.py and models/ (QNetwork)"

    def __init__(self, fast: Any, reference: Callable[[Any, Any, Any], Any], q_values: Callable[[Any], Tensor]):
        self.fast, self.reference, self.q_values = fast, reference, q_values
        self.active, self.checked = fast, False

    def __call__(self, obs: Any, explore: Any, random: Any) -> Any:
        if not self.checked:
            self.checked = True
            if steps_aside(self.NAME, self.REFERENCE, self.difference(obs, explore, random)):
                self.active = self.reference
        return self.active(obs, explore, random)

    def difference(self, obs: Any, explore: Any, random: Any) -> float:
        """The larger of the share of envs whose actions differ and the largest difference in Q-values."""
        differ = 0.0
        for mask in (explore, np.zeros_like(explore)):
            differ = max(differ, float((self.fast(obs, mask, random) != self.reference(obs, mask, random)).mean()))
        with torch.no_grad():
            q = self.q_values(obs)
        return max(differ, difference(torch.from_numpy(self.fast.q_values(obs)), q))


class CheckedNoise:
    """A batch's rollout noise (DrawNoise) drawn at once, checked against the reference's step by step draws on copies
    of the seeds' generators at the first rollout: the same numbers and the generators left in the same states, or
    the reference for the rest of the run (a seed must draw what its single run draws, exactly)."""

    NAME, REFERENCE = "rollout noise drawn at once", "algos/batched_ppo.py (draw_noise)"

    def __init__(self, fast: DrawNoise, reference: DrawNoise):
        self.fast, self.reference = fast, reference
        self.active, self.checked = fast, False

    def __call__(
        self, generators: Sequence[torch.Generator], kind: str, shape: tuple[int, int, int], device: torch.device
    ) -> Tensor:
        if self.checked:
            return self.active(generators, kind, shape, device)
        self.checked = True
        copies = [torch.Generator(g.device).set_state(g.get_state()) for g in generators]
        expected = self.reference(copies, kind, shape, device)
        ours = self.fast(generators, kind, shape, device)
        same_states = all(torch.equal(g.get_state(), c.get_state()) for g, c in zip(generators, copies, strict=True))
        if same_states and torch.equal(ours, expected):
            return ours
        diff = difference(ours, expected) or float("inf")  # equal numbers with the streams left elsewhere
        log.warning("%s differs from %s by %.1e: running the reference", self.NAME, self.REFERENCE, diff)
        for g, c in zip(generators, copies, strict=True):  # the streams as the reference left them
            g.set_state(c.get_state())
        self.active = self.reference
        return expected


class CheckedStep:
    """A gradient step without autograd (numpy_steps.py: PPO's MinibatchStep, DQN's GradientStep; continuous_steps.py:
    SAC's and TD3's steps), checked against the reference step on the first call: both step from the same parameters
    and optimizers' states, and what each returns and the gradients each leaves in its optimizers' flat buffers (PPO's
    advantages normalized, clipped) must agree. The fast step's results are kept; if they differ, the reference's, and
    the reference steps for the rest of the run. (A fused loss is its own check, on the same first inputs, inside the
    reference step.)"""

    def __init__(
        self,
        fast: Callable[..., Any],
        reference: Callable[..., Any],
        optimizers: Sequence[FlatAdam],
        names: tuple[str, str],
    ):
        self.fast, self.reference, self.optimizers = fast, reference, optimizers
        self.NAME, self.REFERENCE = names
        self.active, self.checked = fast, False

    def __call__(self, *args: Any) -> Any:
        if self.checked:
            return self.active(*args)
        self.checked = True
        buffers = [t for o in self.optimizers for t in (o.params, o.grads, o.exp_avg, o.exp_avg_sq, o.steps)]
        before = [t.clone() for t in buffers]
        # (PPO's reference step writes the normalized advantages into its minibatch: it gets a copy of the dict)
        expected = self.reference(*(dict(a) if isinstance(a, dict) else a for a in args))
        after = [t.clone() for t in buffers]
        expected_grads = [flat_views(o.grads.clone(), o.owned) for o in self.optimizers]
        for t, s in zip(buffers, before, strict=True):
            t.copy_(s)
        ours = self.fast(*args)
        diff = max(difference(a, b) for a, b in zip(_tensors(ours), _tensors(expected), strict=True))
        for o, grads in zip(self.optimizers, expected_grads, strict=True):
            diff = max(diff, gradient_difference(flat_views(o.grads, o.owned), grads))
        if steps_aside(self.NAME, self.REFERENCE, diff):
            self.active = self.reference
            for t, s in zip(buffers, after, strict=True):
                t.copy_(s)  # as the reference's step left them
            return expected
        return ours


def _tensors(out: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """A step's output (one tensor, or a tuple of them) as a tuple."""
    return (out,) if isinstance(out, Tensor) else out
