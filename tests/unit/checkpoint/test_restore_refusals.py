"""A refused restore is counted per typed reason, the way checkpoint failures are, and
every error a restore raises to refuse maps to its reason."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sparkpoint.checkpoint.reasons import RestoreRefusal
from sparkpoint.checkpoint.stats import CheckpointStatsTracker
from sparkpoint.errors import (ConfigError, IncompatibleStateSchemaError, NoValidCheckpointError,
                               PublishedEpochsNotReplayableError)
from sparkpoint.runtime.restore import restore_refusal


def test_a_refused_restore_is_counted_by_reason_in_the_snapshot_and_the_metrics():
    registry = CollectorRegistry()
    stats = CheckpointStatsTracker("orders", registry=registry)
    stats.report_restore_refused(RestoreRefusal.INCOMPATIBLE_STATE_SCHEMA)
    stats.report_restore_refused(RestoreRefusal.INCOMPATIBLE_STATE_SCHEMA)
    stats.report_restore_refused(RestoreRefusal.NO_VALID_CHECKPOINT)
    assert stats.snapshot()["restore_refusals"] == {"INCOMPATIBLE_STATE_SCHEMA": 2, "NO_VALID_CHECKPOINT": 1}
    assert registry.get_sample_value("sparkpoint_restore_refusals_total",
                                     {"job_name": "orders", "reason": "INCOMPATIBLE_STATE_SCHEMA"}) == 2
    assert stats.snapshot()["restored"] == 0  # a refusal is not a restore


@pytest.mark.parametrize("error, reason", [
    (IncompatibleStateSchemaError("step 'totals', state 'totals', field 'total' is dropped"),
     RestoreRefusal.INCOMPATIBLE_STATE_SCHEMA),
    (PublishedEpochsNotReplayableError("epoch 3 was published"), RestoreRefusal.UNREPLAYABLE_PUBLISHED_EPOCHS),
    (NoValidCheckpointError("none restores"), RestoreRefusal.NO_VALID_CHECKPOINT),
])
def test_each_refusing_error_maps_to_its_reason(error, reason):
    assert restore_refusal(error) is reason


def test_an_error_that_is_not_a_refusal_is_not_counted_as_one():
    assert restore_refusal(ConfigError("bad setting")) is None
    assert restore_refusal(OSError("storage down")) is None


def test_every_reason_says_what_happened():
    assert all(r.message and str(r) == r.name for r in RestoreRefusal)


def test_the_failure_reasons_page_lists_every_restore_refusal():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[3] / "docs" / "failure-reasons.md").read_text()
    listed = {line.split("|")[1].strip().strip("`") for line in page.split("## Restore refusals", 1)[1].splitlines()
              if line.startswith("| `")}
    assert listed == set(RestoreRefusal.__members__)
