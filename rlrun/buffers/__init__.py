"""Experience storage: the on-policy rollout (preallocated [T, N] tensors)."""
