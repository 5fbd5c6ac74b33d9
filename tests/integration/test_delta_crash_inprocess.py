"""A keyed aggregate writing a Delta table, appending or merging by key, crashes three
times in-process (tests/inprocess.py) at the moments a Delta commit can be cut: after a
checkpoint's `_metadata` is durable and before its Delta commit; right after a Delta
commit; and with epochs staged that no checkpoint carries yet. The last run finishes,
and the table, read with delta-rs, holds exactly what the input alone says it must
(tests/e2e/chaos_oracles.py, no failure-free reference job): every update once when
appending, each key's final totals when merging. No checkpoint reaches the table twice,
the table's application transaction names the last one, and no data file is left that
no commit names.

The same table on an S3 API (the run's S3 server, a process of its own) goes through the
same crashes. A real SIGKILL of a Delta job (driver, JVM and Python workers) is the Delta
storm in tests/e2e/test_chaos_storm.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint import DeltaSink, GeneratorSource, KeyedAggregate, Pipeline
from sparkpoint.runtime.status import JobStatus
from tests.e2e.chaos_oracles import aggregate_updates, as_canonical
from tests.e2e.delta_job import read_delta
from tests.e2e.harness import canonical
from tests.inprocess import CrashPoint, SeamEvent, job_settings, restart, start

pytestmark = pytest.mark.spark

# 12 epochs of 2,000 events: the first two runs end by their crash, never by the input's end.
NAME, KEYS, TOTAL, PER_EPOCH = "delta-crashes", 50, 24_000, 2_000


def _pipeline(url: str, storage_options: dict, merge_keys: list[str] | None) -> Pipeline:
    return (Pipeline(NAME)
            .source(GeneratorSource("events", keys=KEYS, total_events=TOTAL, max_records_per_epoch=PER_EPOCH))
            .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
            .sink(DeltaSink(url, storage_options=storage_options, merge_keys=merge_keys)))


def after_a_delta_commit() -> CrashPoint:
    """Right after the sink committed a checkpoint of this run to the table (before the
    run records anything more: the restart must not commit it again)."""
    return CrashPoint("right after a Delta commit",
                      lambda e, done: e.seam == "sink" and e.what == "commit" and e.after and done >= 1)


def with_epochs_staged(epochs: int) -> CrashPoint:
    """Once this run staged `epochs` epochs (after a checkpoint of its own completed):
    their data files are in the table's directory, no checkpoint carries them."""
    staged: list[int] = []

    def matches(e: SeamEvent, done: int) -> bool:
        if e.seam == "sink" and e.after and e.what in ("stage_epoch", "write_epoch") and done >= 1:
            staged.append(e.epoch)
        return len(staged) >= epochs

    return CrashPoint(f"with {epochs} epochs staged after a completed checkpoint", matches)


def _checkpoint_commits(history: list[dict]) -> list[int]:
    return [h["sparkpoint.checkpoint"] for h in history if "sparkpoint.checkpoint" in h]


def _crash_three_times_then_finish(spark, tmp_path: Path, url: str, options: dict,
                                   merge_keys: list[str] | None) -> None:
    # Epochs are never cut by time: the update-mode oracle is a function of PER_EPOCH, and
    # on a loaded machine an epoch may take longer than the sizer's ceiling (a quarter of
    # the checkpoint timeout), which would cut the next ones smaller. Checkpoints come
    # every few epochs at any machine speed (an epoch of 2,000 events takes 100-300 ms):
    # at 1 s a quick run staged all its remaining epochs before its first checkpoint, and
    # the third crash point, which waits for epochs after one, was never reached.
    settings = job_settings(tmp_path, NAME, **{"sparkpoint.epoch.max-duration": 0,
                                               "execution.checkpointing.interval": "200 ms"})
    first = start(_pipeline(url, options, merge_keys), settings, spark,
                  crash_at=CrashPoint.after_metadata(1)).wait_crashed()
    assert first.switch.completed == 1, first.tail()
    second = restart(first, _pipeline(url, options, merge_keys), spark,
                     crash_at=after_a_delta_commit()).wait_crashed()
    assert second.job.restored_from is not None, second.tail()
    third = restart(second, _pipeline(url, options, merge_keys), spark,
                    crash_at=with_epochs_staged(2)).wait_crashed()
    last = restart(third, _pipeline(url, options, merge_keys), spark)
    assert last.wait().status is JobStatus.FINISHED, last.tail()
    assert last.job.restored_from is not None, last.tail()
    for run in (first, second, third):
        assert run.switch.crashed and not run.job.final_done, run.tail()


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def table(request, tmp_path: Path) -> tuple[str, dict, dict]:
    """(table url, the sink's storage options, delta-rs's) on local disk or on S3."""
    if request.param == "local":
        return str(tmp_path / "table"), {}, {}
    from sparkpoint.connectors.delta_sink import translate_storage_options

    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    options = server.storage_options()
    return f"s3://{bucket}/table", options, translate_storage_options("s3", options)


def test_appended_updates_after_three_crashes_equal_the_updates_of_the_input(spark, tmp_path: Path, table):
    from deltalake import DeltaTable

    url, options, delta_options = table
    _crash_three_times_then_finish(spark, tmp_path, url, options, merge_keys=None)

    rows = read_delta(url, delta_options)
    expected = as_canonical(aggregate_updates(TOTAL, keys=KEYS, per_epoch=PER_EPOCH), rows.column_names)
    assert len(expected) > 100
    got = canonical(rows, drop=())
    assert len(got) == len(expected), f"{len(got)} rows vs {len(expected)}"
    assert got == expected

    delta = DeltaTable(url, storage_options=delta_options)
    commits = _checkpoint_commits(delta.history())
    assert commits and len(commits) == len(set(commits)), f"a checkpoint was committed twice: {commits}"
    assert delta.transaction_version(NAME) == max(commits)
    if not url.startswith("s3://"):
        on_disk = sorted(str(p.relative_to(url)) for p in Path(url).glob("epoch-*/*.parquet"))
        active = sorted(delta.get_add_actions(flatten=True).column("path").to_pylist())
        assert on_disk == active, "data files no commit names were left behind"


def test_updates_merged_by_key_after_three_crashes_hold_each_keys_final_totals(spark, tmp_path: Path):
    from deltalake import DeltaTable

    url = str(tmp_path / "table")
    _crash_three_times_then_finish(spark, tmp_path, url, {}, merge_keys=["key"])

    rows = read_delta(url)
    latest = {}
    for row in aggregate_updates(TOTAL, keys=KEYS, per_epoch=PER_EPOCH, with_epoch=False):
        latest[row["key"]] = row  # in epoch order: the last is the key's final totals
    expected = as_canonical(list(latest.values()), rows.column_names)
    got = canonical(rows, drop=())
    assert len(got) == len(expected) == KEYS, f"{len(got)} rows"
    assert got == expected

    delta = DeltaTable(url)
    commits = _checkpoint_commits(delta.history())
    assert commits and len(commits) == len(set(commits)), f"a checkpoint was merged twice: {commits}"
    assert delta.transaction_version(NAME) == max(commits)
    assert not list(Path(url).glob("epoch-*/*.parquet")), "staged files were left behind"
