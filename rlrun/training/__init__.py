"""One training run on one rank, one concern per module: the signals that stop it (signals), its parts built in order
(parts), the loop over them (loop), what it logs and sums up (run_log), and its checkpoints: writing, resuming,
recovering (resume). rlrun/train.py is the entry point that ties them together."""
