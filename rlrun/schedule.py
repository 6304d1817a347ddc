"""Training progress in [0, 1], as the annealed quantities see it (learning rate, exploration epsilon, PER beta), and
how it continues when a resume changes the budget: from the value the last update used to its end at the new total,
anchored at the resume point, so nothing jumps (a run that completed its budget has annealed its learning rate to
almost 0: continuing from the value its next update would have used, exactly 0, would train it no further)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class Progress:
    """progress(env_steps) = anchor_progress at anchor_steps, rising linearly to 1 at total_steps. A run that was
    never extended has the anchor (0, 0): env_steps / total_steps, exactly."""

    total_steps: int
    anchor_steps: int = 0
    anchor_progress: float = 0.0

    def __call__(self, env_steps: int) -> float:
        span = self.total_steps - self.anchor_steps
        return self.anchor_progress + (1.0 - self.anchor_progress) * (env_steps - self.anchor_steps) / span

    def step_at(self, progress: float) -> int:
        """The env step at which `progress` is reached."""
        span = self.total_steps - self.anchor_steps
        return round(self.anchor_steps + (progress - self.anchor_progress) / (1.0 - self.anchor_progress) * span)

    def state(self) -> dict[str, Any]:
        return asdict(self)


def resumed_progress(state: dict[str, Any] | None, total_steps: int, steps_per_iteration: int) -> tuple[Progress, bool]:
    """The progress a run trains with, and whether a resume changed its budget (so its schedules were re-anchored
    at the progress of the checkpoint's last update, one iteration before it). A checkpoint from before schedules
    were saved ran on env_steps / its config's total_steps."""
    if state is None:
        return Progress(total_steps), False
    saved = state.get("schedule")
    before = Progress(**saved) if saved else Progress(int(yaml.safe_load(state["config"])["total_steps"]))
    if before.total_steps == total_steps:
        return before, False
    steps = state["env_steps"]
    return Progress(total_steps, steps, before(max(0, steps - steps_per_iteration))), True


def continuation_lines(
    annealed: list[tuple[str, Callable[[float], float], float]], progress: Progress, env_steps: int
) -> list[str]:
    """One line per annealed quantity of a resumed run whose budget changed: where it continues from, where it
    goes. `annealed`: (name, value at a progress, the progress at which it reaches its end) per quantity."""
    now = progress(env_steps)
    lines = []
    for name, value, end in annealed:
        if now >= end:
            lines.append(f"{name} stays at {_num(value(end))}")
        else:
            at = progress.step_at(end)
            lines.append(f"{name} continues from {_num(value(now))}, annealing to {_num(value(end))} at step {at:,}")
    return lines


def _num(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}" if abs(x) < 1e-2 else f"{x:.3g}"
