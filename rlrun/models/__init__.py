"""Networks: encoders (MLP, Nature CNN), recurrent cores (LSTM, GRU, LRU) and the actor-critics built on them."""

from rlrun.models.actor_critic import ActorCritic, RecurrentActorCritic, build_actor_critic

__all__ = ["ActorCritic", "RecurrentActorCritic", "build_actor_critic"]
