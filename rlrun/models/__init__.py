"""Networks: encoders (MLP, Nature CNN), recurrent cores (LSTM, GRU, LRU) and the actor-critics built on them."""

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from rlrun.models.actor_critic import ActorCritic, RecurrentActorCritic, UserActorCritic, build_actor_critic

__all__ = ["ActorCritic", "RecurrentActorCritic", "UserActorCritic", "build_actor_critic", "eval_mode", "trainable"]


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer trains (and DDP synchronizes): those that require a gradient."""
    return [p for p in module.parameters() if p.requires_grad]


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """`module` in eval mode for the block (acting: BatchNorm uses its running statistics and, synchronized, runs
    no collective, which only some ranks would reach), then back in the mode it was in."""
    training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(training)
