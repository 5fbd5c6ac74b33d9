"""docs/failure-reasons.md and the enum say the same thing."""

from __future__ import annotations

from pathlib import Path

from sparkpoint.checkpoint import CheckpointFailureReason as R

DOC = Path(__file__).resolve().parents[3] / "docs" / "failure-reasons.md"


def doc_rows() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] in R.__members__:
            rows[cells[0]] = cells
    return rows


def yes(cell: str) -> bool:
    assert cell in ("yes", "no"), cell
    return cell == "yes"


def test_every_reason_has_a_row_with_the_enum_decisions():
    rows = doc_rows()
    assert set(rows) == set(R.__members__)
    for reason in R:
        _, counted, preflight, _alarm, stops, action = rows[reason.name]
        assert (yes(counted), yes(preflight), yes(stops)) == (reason.counted, reason.preflight, reason.fatal), reason
        assert action, f"{reason.name}: say what a person should do"


def test_counted_reasons_are_exactly_those_of_the_design_plus_trigger_failure():
    # DESIGN.md §4: coordinator storage I/O, task async and sync failure, decline, expiry,
    # finalize. TRIGGER_FAILED is counted so a runtime that cannot deliver barriers fails
    # the job instead of running forever without checkpoints (docs/failure-reasons.md).
    assert {r for r in R if r.counted} == {
        R.IO_EXCEPTION, R.TASK_ASYNC_FAILURE, R.TASK_SYNC_FAILURE, R.DECLINED_BY_TASK,
        R.EXPIRED, R.FINALIZE_FAILED, R.TRIGGER_FAILED}


def test_only_the_lost_lease_stops_the_job_outright():
    assert {r for r in R if r.fatal} == {R.LEASE_LOST}
