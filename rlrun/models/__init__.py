"""Networks: encoders (MLP, Nature CNN) and the actor-critic built on them."""

from rlrun.models.actor_critic import ActorCritic

__all__ = ["ActorCritic"]
