"""The user's test harness (sparkpoint.testing.ProcessorTester) behaves like a job: the
README's Sessionize processor over the same input, one file per epoch, through a real
job on the shared Spark session and through the tester (with a snapshot and a restore
in the middle) produces the same rows in the same epochs, late rows included. And the
tester puts keys in the key groups Spark puts them in."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from failure_support import settings
from sparkpoint import FileSource, ParquetSink, Pipeline, ProcessorOperator
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.testing import ProcessorTester
from sparkpoint.testing.harness_keys import key_groups
from tests.e2e.harness import read_output
from tests.sessionize import Sessionize

pytestmark = pytest.mark.spark

FILES = 6
SCHEMA = "key BIGINT, session_start BIGINT, session_end BIGINT, events BIGINT"




def write_input(directory: Path) -> list[Path]:
    """Six files of clicks: keys come and go (sessions close mid-run), and some rows are
    a minute late (their key's session already closed: the processor starts a new one
    whose timer is due at once)."""
    rng = random.Random(7)
    directory.mkdir()
    files = []
    for i in range(FILES):
        ts = [i * 40_000 + rng.randrange(40_000) for _ in range(60)]
        late = [max(0, i * 40_000 - 60_000 + rng.randrange(10_000)) for _ in range(4)] if i >= 2 else []
        # Each file's on-time clicks come from keys 4i..4i+7: a key falls silent and its session closes.
        keys = [rng.randrange(4 * i, 4 * i + 8) for _ in ts] + [rng.randrange(0, 4 * i) for _ in late]
        path = directory / f"clicks-{i:02d}.parquet"
        pq.write_table(pa.table({"key": pa.array(keys, pa.int64()), "ts": pa.array(ts + late, pa.int64())}), path)
        files.append(path)
    return files


def pipeline(source_dir: Path, out: Path) -> Pipeline:
    return (Pipeline("sessions")
            .source(FileSource(str(source_dir), format="parquet", schema="key BIGINT, ts BIGINT",
                               max_files_per_epoch=1, bounded=True))
            .watermark("ts", delay="5 s")
            .stateful(ProcessorOperator("sessionize", Sessionize, ["key"], SCHEMA, time_mode="eventtime"))
            .sink(ParquetSink(str(out))))


def rows_by_epoch(table: pa.Table) -> list[tuple]:
    cols = ["epoch", "key", "session_start", "session_end", "events"]
    return sorted(tuple(r[c] for c in cols) for r in table.select(cols).to_pylist())


def test_the_tester_produces_what_a_job_produces_epoch_by_epoch(spark, tmp_path: Path) -> None:
    files = write_input(tmp_path / "in")
    # No periodic checkpoint during the run: a barrier while the source is idle adds an
    # epoch without input, and timers due at its watermark would fire one epoch earlier.
    job = JobMaster(pipeline(tmp_path / "in", tmp_path / "out"),
                    settings(tmp_path, "sessions", [], **{"execution.checkpointing.interval": "1 h"}), spark=spark)
    job.run()
    from_job = rows_by_epoch(read_output(tmp_path / "out"))

    tester = ProcessorTester(pipeline(tmp_path / "in", tmp_path / "unused"))  # the pipeline's step and watermark
    outputs = []
    for i, file in enumerate(files):
        if i == FILES // 2:  # a checkpoint, then a restore into a fresh tester, as after a crash
            tester = ProcessorTester.from_snapshot(pipeline(tmp_path / "in", tmp_path / "unused"),
                                                   tester.snapshot().to_json())
        out = tester.process(pd.read_parquet(file))
        if i == FILES // 2:
            # The restore rebuilt a new local store from the snapshot's files; the first epoch
            # after it works on that store, as a job's does.
            assert tester.last_epoch_report["how"] == "local"
        outputs.append(out.assign(epoch=tester.epoch))
    outputs.append(tester.finish().assign(epoch=tester.epoch))
    from_tester = rows_by_epoch(pa.Table.from_pandas(pd.concat(outputs), preserve_index=False))

    assert from_tester == from_job
    assert len({r[0] for r in from_job if r[0] < FILES}) >= 3  # sessions closed mid-run, not only at the end
    assert sum(r[4] for r in from_job) == sum(pq.read_metadata(f).num_rows for f in files)  # every event, once
    assert late_rows(files) > 0  # rows behind the watermark of their epoch were part of the comparison


def late_rows(files: list[Path]) -> int:
    """Rows whose event time is behind the watermark their epoch runs with (the largest
    event time of the epochs before, minus the 5 s delay)."""
    late, top = 0, None
    for file in files:
        ts = pq.read_table(file).column("ts").to_pylist()
        if top is not None:
            late += sum(t < top - 5_000 for t in ts)
        top = max(ts) if top is None else max(top, max(ts))
    return late


def test_the_tester_puts_keys_in_the_key_groups_spark_puts_them_in(spark) -> None:
    from pyspark.sql import functions as F

    rows = [(i * 7919 - 50_000, f"user-{i}" * (i % 5), i % 3 == 0) for i in range(200)] + [(None, None, None)]
    df = spark.createDataFrame(rows, "n BIGINT, s STRING, b BOOLEAN")
    expected = df.select(*[F.pmod(F.xxhash64(*cols), F.lit(128)).alias("kg")
                           for cols in (["n"], ["s"], ["n", "s", "b"])]).toArrow()
    table = df.toArrow()
    for i, cols in enumerate((["n"], ["s"], ["n", "s", "b"])):
        assert key_groups(table, cols, 128).to_pylist() == expected.column(i).cast(pa.int32()).to_pylist(), cols
