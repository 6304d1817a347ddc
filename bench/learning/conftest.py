"""Long learning checks, run by `make learning` and not by `make test`: real training runs to a learned result, each
with a fixed seed and a threshold with margin, and repeated-run stress checks. `make test` keeps a short run of
the same machinery for each (named in each file's docstring). The helpers are the tests' own (tests/conftest.py);
importing its fixtures here registers them, the check that no test leaves processes behind included."""

from tests.conftest import no_processes_left_behind, ray_cluster  # noqa: F401  (fixtures, registered by import)
