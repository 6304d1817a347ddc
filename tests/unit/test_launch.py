"""The launcher's one message for a job whose rank failed (rlrun/launch.py root_cause), from the error files torch's
own writer leaves."""

from __future__ import annotations

import os
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

from rlrun.errors import UserError
from rlrun.launch import root_cause


def _record(path: Path, error: BaseException, monkeypatch) -> None:
    """What @record writes for a rank that raised `error` (torch's ErrorHandler, as in the rank)."""
    path.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))  # where the agent tells each rank to write it
    try:
        raise error
    except UserError as e:
        ErrorHandler().record_exception(e)


def test_an_error_file_a_stopped_rank_left_half_written_is_passed_over(tmp_path, monkeypatch):
    """Both ranks raise; the agent stops the second while it writes its error file (torch's writer truncates, then
    writes): the job's line is still the first rank's error, not the JSON error of reading the other (CI, a DDP edge
    test ended in Hydra's 'Set the environment variable HYDRA_FULL_ERROR=1' line)."""
    first, second = tmp_path / "attempt_0" / "0" / "error.json", tmp_path / "attempt_0" / "1" / "error.json"
    error = UserError("parameters that got no gradient in the last update: branch.weight")
    _record(first, error, monkeypatch)
    _record(second, error, monkeypatch)
    second.write_text(second.read_text()[:40])  # cut short
    failure = ProcessFailure(local_rank=0, pid=os.getpid(), exitcode=1, error_file=str(first))
    line = root_cause(ChildFailedError("rank_main", {0: failure}))
    assert line == "rank 0: parameters that got no gradient in the last update: branch.weight"
