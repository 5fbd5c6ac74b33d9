"""Bad records never vanish: a malformed JSON line, a wrong type or a missing NOT NULL
field is counted (progress, Prometheus) and, with `dead_letter=`, lands in the dead-letter
output exactly once with its raw line and the reason; the `records` counter counts each
input record once per run and shows replays separately."""

from __future__ import annotations

import json
import re
import shutil

import pandas as pd
import pyarrow.dataset as ds
import pytest

from sparkpoint import FileSource, KeyedAggregate, ParquetSink, Pipeline, Settings
from sparkpoint.connectors.base import SourceContext
from sparkpoint.connectors.files import MalformedRecordError
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark

SCHEMA = "key BIGINT NOT NULL, value BIGINT NOT NULL, note STRING"
BAD = {
    "part-001.json": ['{"key": 1, "value": 10', "not json at all"],   # malformed JSON
    "part-003.json": ['{"key": 2}'],                                   # missing NOT NULL field
    "part 004.json": ['{"key": 3, "value": "ten"}'],                   # wrong type (a name to URI-encode)
}


def _inbox(tmp_path, files: int = 6, per_file: int = 50) -> tuple[pd.DataFrame, int]:
    """Good lines plus the BAD ones; returns the good rows and the number of bad lines."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    good = []
    for f in range(files):
        name = f"part-{f:03d}.json" if f != 4 else "part 004.json"
        rows = [{"key": (f * per_file + i) % 7, "value": i, "note": "ok"} for i in range(per_file)]
        good += rows
        lines = [json.dumps(r) for r in rows]
        for j, bad in enumerate(BAD.get(name, [])):
            lines.insert(3 + 10 * j, bad)
        (inbox / name).write_text("\n".join(lines) + "\n")
    return pd.DataFrame(good), sum(len(v) for v in BAD.values())


def _settings(tmp_path, **extra):
    return Settings.load(overrides={
        "pipeline.name": "bad", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "300 ms",
        "sparkpoint.progress": False, "rest.enabled": False,
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 3,
        "restart-strategy.fixed-delay.delay": "10 ms", **extra})


def _read(path) -> pd.DataFrame:
    return ds.dataset(str(path), format="parquet", partitioning="hive",
                      ignore_prefixes=["_", "."]).to_table().to_pandas()


def _final_totals(out: pd.DataFrame) -> dict:
    last = out.sort_values("epoch").groupby("key").tail(1)
    return dict(zip(last.key, last["sum"]))


def test_bad_lines_land_in_the_dead_letter_once_are_counted_and_replays_are_shown_apart(spark, tmp_path):
    good, n_bad = _inbox(tmp_path)
    calls = []

    def fail_once_in_the_fourth_epoch(df):
        calls.append(1)
        if len(calls) == 4:  # no checkpoint yet (interval 1 h): epochs 0-2 are replayed
            raise RuntimeError("injected: an epoch fails once")
        return df

    source = FileSource(str(tmp_path / "in"), schema=SCHEMA, max_files_per_epoch=1, bounded=True,
                        dead_letter=str(tmp_path / "dead"))
    pipeline = (Pipeline("bad").source(source).transform(fail_once_in_the_fourth_epoch)
                .stateful(KeyedAggregate("totals", ["key"], "value", aggs=("sum",), value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    master = JobMaster(pipeline, _settings(tmp_path, **{"execution.checkpointing.interval": "1 h"}), spark=spark)
    result = master.run()
    assert result.status == JobStatus.FINISHED and result.restarts == 1

    # The main output holds the good records only, exactly once.
    expected = good.groupby("key")["value"].sum().to_dict()
    assert _final_totals(_read(tmp_path / "out")) == expected

    # Every bad line is in the dead letter once, raw, with its reason.
    dead = _read(tmp_path / "dead").sort_values(["file", "line"]).reset_index(drop=True)
    assert sorted(zip(dead.file, dead.line)) == sorted((str(tmp_path / "in" / f), line)
                                                       for f, lines in BAD.items() for line in lines)
    reasons = dict(zip(dead.line, dead.reason))
    assert reasons['{"key": 1, "value": 10'].startswith("malformed JSON")
    assert reasons["not json at all"].startswith("malformed JSON")
    assert reasons['{"key": 2}'] == "missing field 'value' (declared NOT NULL)"
    assert reasons['{"key": 3, "value": "ten"}'] == "field 'value': 'ten' is not a BIGINT"
    assert (dead.source == "files").all()
    assert not list((tmp_path / "dead" / "_staging").glob("*.parquet"))  # all published

    # Counted once although epochs 0-2 ran twice; replays shown apart.
    assert source.malformed_records == n_bad
    assert result.records == len(good)
    assert master.replayed_records > 0 and result.extra["replayed_records"] == master.replayed_records
    registry = master.coordinator.stats.registry
    assert registry.get_sample_value("sparkpoint_source_malformed_records_total", {"source": "files"}) == n_bad
    line = master.progress.line()
    assert f"records {len(good):,} (+{master.replayed_records:,} replayed)" in line
    assert f"malformed {n_bad}" in line


def test_dead_letter_files_are_staged_with_the_epoch_and_published_only_by_a_checkpoint(spark, tmp_path):
    _inbox(tmp_path, files=2)
    dead = tmp_path / "dead"

    def source():
        s = FileSource(str(tmp_path / "in"), schema=SCHEMA, dead_letter=str(dead))
        s.open(SourceContext(spark, "bad"))
        return s

    src = source()
    plan = src.plan(src.discover(src.initial_positions()))
    assert src.read(plan).count() == 100
    assert not list(dead.glob("*.parquet"))                      # staged, not visible
    [staged] = [p.name for p in (dead / "_staging").glob("*.parquet")]
    assert re.fullmatch(r"part-001\.json\.[0-9a-f]{16}\.parquet", staged)   # one per input file
    src.read(plan).count()                                       # a replay stages the same again
    assert [p.name for p in (dead / "_staging").glob("*.parquet")] == [staged]
    assert src.malformed_records == 2                            # counted once

    # A crash after the checkpoint's _metadata but before the publish: the next run
    # publishes what the restored positions cover, once.
    src2 = source()
    src2.discover(json.loads(json.dumps(plan.end)))
    assert [p.name for p in dead.glob("*.parquet")] == [staged]
    src2.notify_checkpoint_complete(1, plan.end)
    assert len(_read(dead)) == 2


def test_permissive_without_dead_letter_keeps_spark_semantics_and_counts(spark, tmp_path):
    _inbox(tmp_path, files=5)
    src = FileSource(str(tmp_path / "in"), schema=SCHEMA, options={"columnNameOfCorruptRecord": "_bad"})
    src.open(SourceContext(spark, "bad"))
    rows = src.read(src.plan(src.initial_positions())).toPandas()
    assert len(rows) == 250 + 4 and src.malformed_records == 4
    assert sorted(rows._bad.dropna()) == sorted(line for lines in BAD.values() for line in lines)

    # As in Spark, the corrupt-record column may be declared in the schema as well.
    spark_style = FileSource(str(tmp_path / "in"), schema=SCHEMA + ", _bad STRING",
                             column_name_of_corrupt_record="_bad")
    spark_style.open(SourceContext(spark, "bad"))
    same = spark_style.read(spark_style.plan(spark_style.initial_positions())).toPandas()
    assert list(same.columns) == list(rows.columns) and same._bad.count() == 4

    drop = FileSource(str(tmp_path / "in"), schema=SCHEMA, mode="DROPMALFORMED")
    drop.open(SourceContext(spark, "bad"))
    assert drop.read(drop.plan(drop.initial_positions())).count() == 250 and drop.malformed_records == 4


def test_failfast_stops_the_job_once_naming_the_file_the_reason_and_the_line(spark, tmp_path):
    _inbox(tmp_path, files=2)
    pipeline = (Pipeline("bad").source(FileSource(str(tmp_path / "in"), schema=SCHEMA, mode="FAILFAST",
                                                  bounded=True))
                .stateful(KeyedAggregate("totals", ["key"], "value", aggs=("sum",), value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    master = JobMaster(pipeline, _settings(tmp_path), spark=spark)
    with pytest.raises(MalformedRecordError) as err:
        master.run()
    message = str(err.value)
    assert "part-001.json" in message and "malformed JSON" in message and "\n" not in message
    assert master.restarts == 0 and master.status.status == JobStatus.FAILED


def _dead_letter_source(spark, inbox, dead, **kw) -> FileSource:
    source = FileSource(str(inbox), schema=SCHEMA, dead_letter=str(dead), **kw)
    source.open(SourceContext(spark, "bad"))
    return source


def _read_and_complete(source: FileSource) -> None:
    """One epoch over everything there, then its checkpoint completes."""
    plan = source.plan(source.discover(source.initial_positions()))
    source.read(plan).count()
    source.notify_checkpoint_complete(1, plan.end)


def test_dead_letters_of_two_input_files_with_the_same_name_are_both_kept(spark, tmp_path):
    # Two jobs (default source name "files") read directories that both hold
    # part-001.json and share one dead-letter directory.
    dead = tmp_path / "dead"
    inboxes = {}
    for job, bad in [("east", '{"key": 1, "value": "east"}'), ("west", '{"key": 2, "value": "west"}')]:
        inboxes[job] = tmp_path / job / "in"
        inboxes[job].mkdir(parents=True)
        (inboxes[job] / "part-001.json").write_text(f'{{"key": 0, "value": 0}}\n{bad}\n')

    east = _dead_letter_source(spark, inboxes["east"], dead)
    east.read(east.plan(east.initial_positions())).count()       # staged, not yet published
    _read_and_complete(_dead_letter_source(spark, inboxes["west"], dead))
    _read_and_complete(_dead_letter_source(spark, inboxes["east"], dead))
    _read_and_complete(_dead_letter_source(spark, inboxes["west"], dead))   # a replay: nothing twice

    letters = _read(dead)
    assert sorted(zip(letters.file, letters.line)) == [
        (str(inboxes["east"] / "part-001.json"), '{"key": 1, "value": "east"}'),
        (str(inboxes["west"] / "part-001.json"), '{"key": 2, "value": "west"}')]
    # Still readable: each published file is named after its input file.
    assert [p.name.startswith("part-001.json.") for p in dead.glob("*.parquet")] == [True, True]
    assert not list((dead / "_staging").glob("*.parquet"))


def test_dead_letters_staged_by_an_older_version_are_published_once(spark, tmp_path):
    """Older versions named a dead-letter file after its input file only."""
    _inbox(tmp_path, files=2)
    dead = tmp_path / "dead"

    def stage_as_an_older_version() -> dict:
        source = _dead_letter_source(spark, tmp_path / "in", dead)
        plan = source.plan(source.initial_positions())
        source.read(plan).count()
        [staged] = (dead / "_staging").glob("*.parquet")
        staged.rename(dead / "_staging" / "part-001.json.parquet")
        return json.loads(json.dumps(plan.end))

    # Staged, then a crash after the checkpoint's _metadata, before the publish: the
    # upgraded run publishes it; a later replay of the file adds nothing.
    covered = stage_as_an_older_version()
    _dead_letter_source(spark, tmp_path / "in", dead).discover(covered)
    assert [p.name for p in dead.glob("*.parquet")] == ["part-001.json.parquet"]
    _read_and_complete(_dead_letter_source(spark, tmp_path / "in", dead))
    assert len(_read(dead)) == 2

    # Staged by an epoch no checkpoint covered: the upgraded run replays the file and
    # stages it again under the new name; one of the two is published.
    shutil.rmtree(dead)
    stage_as_an_older_version()
    _read_and_complete(_dead_letter_source(spark, tmp_path / "in", dead))
    assert len(_read(dead)) == 2
    assert not list((dead / "_staging").glob("*.parquet"))


def test_bad_records_passed_on_as_null_rows_are_warned_once_per_epoch_with_the_count(spark, tmp_path, caplog):
    _inbox(tmp_path, files=4)   # bad lines in part-001 (2), part-003 (1)
    source = FileSource(str(tmp_path / "in"), schema=SCHEMA, max_files_per_epoch=2)
    source.open(SourceContext(spark, "bad"))
    positions = source.initial_positions()
    with caplog.at_level("WARNING", logger="sparkpoint.connectors.files"):
        for _ in range(2):
            plan = source.plan(positions)
            source.read(plan).count()
            positions = plan.end
    warnings = [r.getMessage() for r in caplog.records if r.name == "sparkpoint.connectors.files"]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("FileSource 'files': 2 bad records in this epoch (part-001.json: ")
    assert warnings[1].startswith("FileSource 'files': 1 bad record in this epoch (part-003.json: ")
    assert all("rows of nulls" in w and "dead_letter=" in w and "mode='DROPMALFORMED'" in w for w in warnings)

    # Asked for by name, Spark's semantics are not warned about.
    caplog.clear()
    for chosen in [{"mode": "PERMISSIVE"}, {"column_name_of_corrupt_record": "_bad"},
                   {"dead_letter": str(tmp_path / "dead")}, {"mode": "DROPMALFORMED"}]:
        quiet = FileSource(str(tmp_path / "in"), schema=SCHEMA, **chosen)
        quiet.open(SourceContext(spark, "bad"))
        with caplog.at_level("WARNING", logger="sparkpoint.connectors.files"):
            quiet.read(quiet.plan(quiet.initial_positions())).count()
    assert [r.getMessage() for r in caplog.records if r.name == "sparkpoint.connectors.files"] == []


@pytest.mark.parametrize("line, reason", [
    ('{"key": 1, "note": "no end', "malformed JSON: Unterminated string starting at column 20"),
    ('{"key": 1, "value": 10', "malformed JSON: Expecting ',' delimiter at column 23"),
    ("not json at all", "malformed JSON: Expecting value at column 1"),
])
def test_the_malformed_json_reason_names_the_column_once(line, reason):
    from sparkpoint.connectors.files import _RAW, _reason

    assert _reason({_RAW: line}, None) == reason
