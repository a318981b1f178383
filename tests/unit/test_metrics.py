"""metrics.jsonl: StepRecords written, read back, trimmed on resume; bad lines are one error naming file and line."""

import pytest

from orch.planner.errors import SpecError
from orch.runtime.workdir.metrics import StepRecord, append_record, last_record, read_metrics, truncate_after


def _record(step: int) -> StepRecord:
    return StepRecord(step=step, loss=1.0 / (step + 1), tokens=7, step_time_s=0.5, ranks={"0": {"step": 0.5}})


def test_records_round_trip_and_resume_trims_later_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for k in range(4):
        append_record(path, _record(k))
    assert read_metrics(path) == [_record(k) for k in range(4)]
    assert "processed" not in path.read_text()  # absent unless the tests count tokens
    truncate_after(path, 2)
    assert [r.step for r in read_metrics(path)] == [0, 1]
    truncate_after(path, 0)
    assert not path.exists() and read_metrics(path, missing_ok=True) == []


def test_last_record_ignores_a_line_being_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert last_record(path) is None
    append_record(path, _record(0))
    with open(path, "a") as f:
        f.write('{"step": 1, "lo')
    assert last_record(path) == _record(0)  # the partial line is not a record yet: the newest complete one
    path.write_text(_record(3).model_dump_json() + "\n")
    assert last_record(path) == _record(3)


def test_a_bad_line_names_the_file_the_line_and_the_field(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_record(0).model_dump_json() + '\n{"step": 1, "loss": 0.5, "tokens": -1, "step_time_s": 1}\n')
    with pytest.raises(SpecError, match=r"line 2: expected a metrics record .*tokens: input should be greater"):
        read_metrics(path)
    path.write_text('{"step": 0, "loss": 1, "tokens": 1, "step_time_s": 1, "version": 2}\n')
    with pytest.raises(SpecError, match="line 1: .*version"):
        read_metrics(path)  # a newer format is refused, not misread


def test_a_torn_last_line_is_dropped_with_one_line_and_resume_trims_it(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    for k in range(3):
        append_record(path, _record(k))
    with open(path, "a") as f:
        f.write('{"step": 3, "loss": 0.2')  # a crash while writing step 3's record
    assert read_metrics(path) == [_record(k) for k in range(3)]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"orch: {path}: line 4 is torn") and err[0].endswith("dropped")
    truncate_after(path, 2)  # the relaunch's trim: no JSONDecodeError, the torn line gone
    assert path.read_text() == "".join(_record(k).model_dump_json(exclude_none=True) + "\n" for k in range(2))
    assert read_metrics(path) == [_record(0), _record(1)]


def test_only_the_last_line_may_be_torn(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_record(0).model_dump_json() + '\n{"step": 1, "lo\n' + _record(2).model_dump_json() + "\n")
    with pytest.raises(SpecError, match="line 2: not JSON"):
        read_metrics(path)
    with pytest.raises(SpecError, match="line 2: expected a metrics record"):
        truncate_after(path, 5)
    path.write_text(_record(0).model_dump_json() + '\n{"step": 1, "lo\n')  # ends in a newline: written whole
    with pytest.raises(SpecError, match="line 2: not JSON"):
        read_metrics(path)


def test_a_full_disk_while_appending_names_the_file_and_the_bytes(tmp_path, monkeypatch):
    import os

    from orch.runtime.workdir import metrics
    from orch.runtime.workdir.disk import NoSpaceError

    path = tmp_path / "metrics.jsonl"
    # the record's file opened on /dev/full: its write fails with ENOSPC as a full disk's does
    monkeypatch.setattr(metrics, "open_own", lambda p, flags, mode=0o644: os.open("/dev/full", os.O_WRONLY))
    line = _record(0).model_dump_json(exclude_none=True) + "\n"
    with pytest.raises(NoSpaceError) as err:
        append_record(path, _record(0))
    assert str(err.value).startswith(f"{path}: no space left on device: a step's record needs about")
    assert f"({len(line)} bytes)" in str(err.value) and str(err.value).endswith(" free")


def test_a_diverged_steps_record_keeps_its_nan_and_infinite_values(tmp_path):
    """The step that stops a diverging run is written as it was (NaN, Infinity) and read back by every reader;
    a negative norm is still refused."""
    import math

    path = tmp_path / "metrics.jsonl"
    append_record(path, _record(0))
    nan = _record(1).model_copy(update={"loss": math.nan, "grad_norm": math.nan})
    append_record(path, nan)
    append_record(path, _record(2).model_copy(update={"loss": math.inf, "grad_norm": math.inf}))
    assert '"loss":NaN' in path.read_text() and '"grad_norm":Infinity' in path.read_text()
    read = read_metrics(path)
    assert math.isnan(read[1].loss) and math.isnan(read[1].grad_norm)
    assert read[2].loss == math.inf == read[2].grad_norm
    assert last_record(path).grad_norm == math.inf
    with pytest.raises(ValueError, match="expected a norm >= 0"):
        StepRecord(step=0, loss=1.0, tokens=1, step_time_s=1.0, grad_norm=-1.0)
