"""rlrun: a command-line runner for reinforcement-learning experiments."""

__version__ = "0.1.0"
