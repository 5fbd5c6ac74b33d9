"""`sparkpoint.read_state` on a `Deduplicate` and a `TopN` step of one finished job,
read from its last checkpoint by fresh operator objects (so key types and the top-n's
row columns come from the state itself): every held key with its release time, every
key's top rows with their rank, each equal to what pandas computes from the input."""

from __future__ import annotations

import pandas as pd
import pytest

import sparkpoint
from sparkpoint import Deduplicate, GeneratorSource, ParquetSink, Pipeline, TopN
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from tests.inprocess import job_settings

pytestmark = pytest.mark.spark

DAY = 86_400_000
TOTAL = 6_000
BUCKETS = 7


def _source() -> GeneratorSource:
    return GeneratorSource("ev", keys=20, total_events=TOTAL, max_records_per_epoch=1_500, disorder_ms=0)


def _dedup() -> Deduplicate:
    # A day of event time: no key is released before the end of input, so the state
    # holds every distinct key of the input.
    return Deduplicate("first", ["key", "bucket"], "ts", within=DAY)


def _top() -> TopN:
    return TopN("top", ["key"], [("value", "desc")], 3, rank_column="place")


def test_dedup_and_topn_state_read_from_a_checkpoint_equal_pandas(spark, tmp_path):
    p = Pipeline("dedup-topn-state")
    events = p.read(_source()).watermark("ts", DAY)  # a day behind: nothing is late
    events.transform(lambda df: df.withColumn("bucket", df["value"] % BUCKETS)).stateful(_dedup()) \
        .sink(ParquetSink(str(tmp_path / "out" / "first"), name="first"))
    events.stateful(_top()).sink(ParquetSink(str(tmp_path / "out" / "top"), name="top"))
    settings = job_settings(tmp_path, "dedup-topn-state")
    assert JobMaster(p, settings, spark=spark).run().status is JobStatus.FINISHED

    source = _source()
    source.open(SourceContext(spark, "reference"))
    ends = {s: n for s, n in zip(source.initial_positions(), [TOTAL // 2, TOTAL - TOTAL // 2])}
    rows = source.read(SlicePlan(source.initial_positions(), ends)).toPandas()
    assert len(rows) == TOTAL
    path = str(tmp_path / "checkpoints" / "dedup-topn-state")

    held = sparkpoint.read_state(spark, path, operator=_dedup()).toPandas()
    assert list(held.columns) == ["key", "bucket", "release_ms"]
    want = rows.assign(bucket=rows.value % BUCKETS).groupby(["key", "bucket"], as_index=False).ts.min()
    want = want.assign(release_ms=want.ts + DAY)[["key", "bucket", "release_ms"]]
    pd.testing.assert_frame_equal(held.sort_values(["key", "bucket"]).reset_index(drop=True),
                                  want.sort_values(["key", "bucket"]).reset_index(drop=True), check_dtype=False)

    tops = sparkpoint.read_state(spark, path, operator=_top()).toPandas()
    assert list(tops.columns) == ["key", "place", "value", "ts", "split", "offset"]
    # Ties of value are broken by the other columns, ascending, in table order.
    ranked = rows.sort_values(["key", "value", "ts", "split", "offset"], ascending=[True, False, True, True, True])
    want = ranked.groupby("key").head(3)
    want = want.assign(place=want.groupby("key").cumcount() + 1)[list(tops.columns)]
    pd.testing.assert_frame_equal(tops.sort_values(["key", "place"]).reset_index(drop=True),
                                  want.sort_values(["key", "place"]).reset_index(drop=True), check_dtype=False)
    with pytest.raises(Exception, match="TopN 'top' keeps no timers"):
        sparkpoint.read_timers(spark, path, operator=_top())
