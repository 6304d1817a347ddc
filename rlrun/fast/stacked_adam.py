"""A batch of seeds' Adam step (SeedSteps.step, rlrun/algos/stacked.py) as one call of torch's fused Adam kernel over
the active seeds' slices, without torch.optim.Adam's per-tensor bookkeeping: at PPO's sizes SeedSteps holds 64 small
slices (8 per seed), and torch.optim's step over them costs several times the kernel. Layout only: the same kernel on
the same state (torch.optim's, what SeedOptimizer reads and loads for the seeds' checkpoints), with the same settings,
after the same increment of each slice's step count, so every seed's weights and moments are SeedSteps' own to the
bit (tests/unit/test_batched_ppo.py steps both side by side). A step where some active slice has no state yet (its
seed's first) is SeedSteps' own, which makes that state as torch.optim makes it."""

from __future__ import annotations

import torch
from torch import Tensor

from rlrun.algos.stacked import SeedSteps

# The settings under which torch.optim.Adam's step is the fused kernel alone (torch/optim/adam.py, _fused_adam).
_PLAIN = {"amsgrad": False, "maximize": False, "capturable": False, "differentiable": False, "fused": True}


class SeedsAdamStep:
    """SeedSteps.step's drop-in (step(active)) for `steps`, a SeedSteps of torch.optim.Adam where applies() holds."""

    def __init__(self, steps: SeedSteps) -> None:
        self.steps = steps
        # Every slice's step count in one buffer [S, J], its state's "step" a view of its entry: the active seeds'
        # counts move on in one operation (torch's _foreach_add_ over 64 scalars costs more than the kernel).
        self.counts = torch.zeros(0)
        self.count_views: list[list[Tensor]] = []

    @staticmethod
    def applies(steps: SeedSteps) -> bool:
        """Whether each slice steps as torch.optim.Adam(fused=True) alone: one group, none of Adam's variants."""
        group = steps.param_groups[0]
        plain = all(group.get(k, v) == v for k, v in _PLAIN.items()) and not group.get("decoupled_weight_decay")
        return type(steps.optimizer) is torch.optim.Adam and len(steps.param_groups) == 1 and plain

    @torch.no_grad()
    def __call__(self, active: Tensor | None = None) -> None:
        """One step of the seeds where active [S] (bool; all when None) is true."""
        steps, state = self.steps, self.steps.optimizer.state
        on = [True] * steps.S if active is None else active.tolist()
        grads = [p.grad.unbind(0) for p in steps.params if p.grad is not None]  # [J][S], each seed's slice
        if len(grads) < len(steps.params):
            return steps.step(active)
        xs, gs, exp_avgs, exp_avg_sqs, counts = [], [], [], [], []
        for s, seed in enumerate(steps.slices):
            if not on[s]:
                continue
            for j, x in enumerate(seed):
                own = state.get(x)
                if not own:  # the seed's first step: torch.optim makes its state
                    return steps.step(active)
                count = self._count_view(s, j, own["step"])
                if own["step"] is not count:  # made by torch.optim, or loaded from a checkpoint since
                    own["step"] = count.copy_(own["step"])
                xs.append(x)
                gs.append(grads[j][s])
                exp_avgs.append(own["exp_avg"])
                exp_avg_sqs.append(own["exp_avg_sq"])
                counts.append(own["step"])
        if not xs:
            return None
        group = steps.param_groups[0]
        beta1, beta2 = group["betas"]
        # +1 for the active seeds' slices, as torch.optim's Adam does before the kernel reads them
        self.counts.add_(torch.tensor(on, dtype=self.counts.dtype, device=self.counts.device)[:, None])
        torch._fused_adam_(  # the kernel behind torch.optim.Adam(fused=True)
            xs,
            gs,
            exp_avgs,
            exp_avg_sqs,
            [],
            counts,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            amsgrad=False,
            maximize=False,
        )
        return None

    def _count_view(self, s: int, j: int, like: Tensor) -> Tensor:
        """Slice (s, j)'s entry of the counts' buffer, made at the first step (as torch.optim makes its counts)."""
        if not self.count_views:
            S, J = self.steps.S, len(self.steps.params)
            self.counts = torch.zeros(S, J, dtype=like.dtype, device=like.device)
            self.count_views = [[self.counts[i, k] for k in range(J)] for i in range(S)]
        return self.count_views[s][j]
