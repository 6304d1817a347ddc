"""`python -m rlrun` is `rlrun`."""

from rlrun.cli import main

main()
