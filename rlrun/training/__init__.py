"""What the training loop (rlrun/train.py) runs on, one concern per module: the signals that stop a run (signals), its
parts built in order into one bundle (parts), what it logs and sums up, gathered once per iteration (run_log), and its
checkpoints: writing, resuming, recovering (resume). Nothing here imports rlrun.train."""
