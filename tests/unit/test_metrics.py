"""metrics.jsonl: StepRecords written, read back, trimmed on resume; bad lines are one error naming file and line."""

import pytest

from orch.planner.errors import SpecError
from orch.runtime.metrics import StepRecord, append_record, last_record, read_metrics, truncate_after


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
    assert last_record(path) is None  # the partial line is not a record yet
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
