"""Update-mode output merged into a Delta table by key is what a reader can use: after a
job crashed and was restored, the table holds one row per key (or per key and window),
equal to the final aggregates of the whole input computed by pandas from the events
alone (the generator's events recomputed without Spark or sparkpoint). A row lost, a
row left twice, or an epoch merged twice or out of order shows as a difference.

The jobs crash in-process (tests/inprocess.py): the keyed aggregate right after its
first checkpoint's `_metadata` is durable and before that checkpoint's MERGE (recovery
must run it, then the epochs after it); the window after it staged an epoch that no
checkpoint carries yet (recovery drops it and the epoch runs again)."""

from __future__ import annotations

import pandas as pd
import pytest
from deltalake import DeltaTable

from sparkpoint import DeltaSink, GeneratorSource, KeyedAggregate, Pipeline, SlidingWindow
from sparkpoint.connectors.delta_sink import read_committed
from sparkpoint.runtime.status import JobStatus
from tests.e2e.chaos_oracles import spark_xxhash64
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = pytest.mark.spark

TOTAL, PER_EPOCH, SEED, SPLITS = 20_000, 2_000, 7, 2
START_TS, EVENTS_PER_S, DISORDER_MS = 1_700_000_000_000, 10_000, 2_000


def generated_events(keys: int) -> pd.DataFrame:
    """GeneratorSource's events (key, value, ts), as its SQL defines them: event g of
    split s is record n = (g - s) / splits; a BIGINT cast truncates the double division."""
    rows = []
    for g in range(TOTAL):
        ts = int(START_TS + (g * 1000) / EVENTS_PER_S) - spark_xxhash64(SEED + 1, g) % DISORDER_MS
        rows.append((spark_xxhash64(SEED, g) % keys, spark_xxhash64(SEED + 2, g) % 1000, ts))
    return pd.DataFrame(rows, columns=["key", "value", "ts"])


def table_rows(out, keys: list[str]) -> pd.DataFrame:
    got = read_committed(str(out)).to_pandas()
    assert not got.duplicated(keys).any(), f"a reader sees a key twice:\n{got[got.duplicated(keys, keep=False)]}"
    return got.sort_values(keys).reset_index(drop=True)


# -- a keyed aggregate in update mode ---------------------------------------------------------
AGG_KEYS = 500


def aggregate_pipeline(name: str, out) -> Pipeline:
    return (Pipeline(name)
            .source(GeneratorSource("events", keys=AGG_KEYS, total_events=TOTAL, max_records_per_epoch=PER_EPOCH))
            .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
            .sink(DeltaSink(str(out), merge_keys=["key"])))


def test_keyed_aggregate_updates_merged_by_key_equal_the_final_totals_after_a_crash(spark, tmp_path):
    name, out = "merged-totals", tmp_path / "totals"
    first = start(aggregate_pipeline(name, out), job_settings(tmp_path, name), spark,
                  crash_at=CrashPoint.after_metadata(1)).wait_crashed()
    assert first.switch.completed == 1, first.tail()
    assert not DeltaTable.is_deltatable(str(out)), "the crash came before the first checkpoint's merge"

    second = restart(first, aggregate_pipeline(name, out), spark)
    assert second.wait().status is JobStatus.FINISHED, second.tail()
    assert second.job.restored_from is not None, second.tail()

    events = generated_events(AGG_KEYS)
    expected = (events.groupby("key")["value"].agg(["count", "sum", "min", "max"]).reset_index()
                .astype("int64").sort_values("key").reset_index(drop=True))
    got = table_rows(out, ["key"])
    assert list(got.columns) == ["key", "count", "sum", "min", "max"]
    pd.testing.assert_frame_equal(got.astype("int64"), expected)
    history = DeltaTable(str(out)).history()
    assert any(h["operation"] == "MERGE" for h in history), "later checkpoints merged into the table"


# -- a sliding window in update mode, with late rows ------------------------------------------
WINDOW_KEYS, SIZE_MS, SLIDE_MS = 40, 400, 200


def window_pipeline(name: str, out) -> Pipeline:
    # A watermark far tighter than the events' disorder: many rows arrive after the watermark
    # passed their windows (late updates), none beyond the allowed lateness (none dropped).
    return (Pipeline(name)
            .source(GeneratorSource("events", keys=WINDOW_KEYS, total_events=TOTAL, max_records_per_epoch=PER_EPOCH))
            .watermark("ts", delay="100 ms")
            .stateful(SlidingWindow("hop", ["key"], "ts", size=f"{SIZE_MS} ms", slide=f"{SLIDE_MS} ms",
                                    aggs=("count", "sum", "max"), value_column="value", value_type="bigint",
                                    allowed_lateness="10 s", output_mode="update"))
            .sink(DeltaSink(str(out), merge_keys=["key", "window_start"])))


def window_reference(events: pd.DataFrame) -> pd.DataFrame:
    """Every (key, window) of every event: windows [k * slide, k * slide + size) holding ts."""
    rows = []
    for key, value, ts in events.itertuples(index=False):
        first = (ts - SIZE_MS) // SLIDE_MS + 1
        for k in range(first, ts // SLIDE_MS + 1):
            rows.append((key, k * SLIDE_MS, k * SLIDE_MS + SIZE_MS, value))
    df = pd.DataFrame(rows, columns=["key", "window_start", "window_end", "value"])
    out = df.groupby(["key", "window_start", "window_end"])["value"].agg(["count", "sum", "max"]).reset_index()
    return out.astype("int64").sort_values(["key", "window_start"]).reset_index(drop=True)


def test_window_updates_and_late_refires_merged_by_window_equal_the_batch_windows_after_a_crash(spark, tmp_path):
    name, out = "merged-windows", tmp_path / "windows"
    settings = job_settings(tmp_path, name, **{"execution.checkpointing.interval": "200 ms"})
    first = start(window_pipeline(name, out), settings, spark, crash_at=CrashPoint.after_epoch(6)).wait_crashed()
    assert first.switch.completed >= 1, first.tail()

    second = restart(first, window_pipeline(name, out), spark)
    assert second.wait().status is JobStatus.FINISHED, second.tail()
    assert second.job.restored_from is not None, second.tail()

    got = table_rows(out, ["key", "window_start"])
    assert list(got.columns) == ["key", "window_start", "window_end", "count", "sum", "max", "late"]
    assert got["late"].any(), "late rows re-fired windows (the case merging must fold into one row)"
    expected = window_reference(generated_events(WINDOW_KEYS))
    pd.testing.assert_frame_equal(got.drop(columns=["late"]).astype("int64"), expected)


# -- bad configuration ------------------------------------------------------------------------
def test_merge_keys_that_the_output_lacks_stop_the_job_once_with_one_clear_error(spark, tmp_path):
    """The output's columns are first known where its rows are written (the executors'
    writer, after the steps' maps): the job stops there, without restarts."""
    from sparkpoint.errors import JobFailedError
    from sparkpoint.runtime.jobmaster import JobMaster

    out = tmp_path / "totals"
    pipeline = (Pipeline("bad-keys")
                .source(GeneratorSource("events", keys=10, total_events=100, max_records_per_epoch=100))
                .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
                .sink(DeltaSink(str(out), merge_keys=["customer"])))
    master = JobMaster(pipeline, job_settings(tmp_path, "bad-keys"), spark=spark)
    with pytest.raises(JobFailedError) as err:
        master.run()
    message = str(err.value)
    assert "\n" not in message and "Not restarted: a configuration error" in message
    assert ("ConfigError: sink delta: merge_keys ['customer'] are not columns of the output (key, count, sum, min, "
            "max); name the output's key columns in DeltaSink(merge_keys=...)") in message
    assert master.restarts == 0 and master.status.status is JobStatus.FAILED
    assert not DeltaTable.is_deltatable(str(out))
