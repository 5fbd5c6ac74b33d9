"""The Delta sink's merge-by-key mode (`DeltaSink(path, merge_keys=[...])`) without Spark:
each checkpoint's rows are upserted into the table by key, so a reader sees one row per
key, the last one written. What every sink must do (abort, re-commit, recover, restore)
runs for this mode too in tests/contracts/test_sink_contract.py; this file checks what
merging adds: last-writer-wins per key within and across epochs, the txn and the merged
epochs recorded by the MERGE commit itself, rewinding a merged table on restore, and the
refusal of bad keys. Executors are played by a pickled copy of the sink's writer, a crash
by not calling the next step and opening a fresh sink on the same table."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark import cloudpickle  # what Spark ships the writer with

from sparkpoint.connectors.delta_sink import DeltaSink, read_committed
from sparkpoint.errors import ConfigError

JOB = "job"


@pytest.fixture
def out(tmp_path) -> str:
    return str(tmp_path / "table dir")


def new_sink(out: str, keys=("k",), **kwargs) -> DeltaSink:
    sink = DeltaSink(out, merge_keys=list(keys), **kwargs)
    sink.open(JOB)
    return sink


def updates(*pairs: tuple[str | None, int]) -> pa.Table:
    """Update rows (key, total) in the order an operator emitted them."""
    return pa.table({"k": pa.array([k for k, _ in pairs], pa.string()),
                     "total": pa.array([t for _, t in pairs], pa.int64())})


def run_epoch(sink: DeltaSink, epoch: int, *parts: tuple[tuple[str | None, int], ...]) -> None:
    """One epoch on 'executors': each part is one task's rows."""
    writer = cloudpickle.loads(cloudpickle.dumps(sink.epoch_writer()))
    handles = [h for part, pairs in enumerate(parts) for h in writer.write(epoch, part, updates(*pairs))]
    sink.stage_epoch(epoch, json.loads(json.dumps(handles)))


def checkpoint(sink: DeltaSink, cid: int) -> dict:
    return json.loads(json.dumps(sink.pre_commit(cid)))


def table(out: str) -> dict[str | None, int]:
    """What a reader sees, asserting it is one row per key."""
    got = read_committed(out)
    keys = got.column("k").to_pylist()
    assert len(keys) == len(set(keys)), f"a key appears more than once: {sorted(keys, key=str)}"
    return dict(zip(keys, got.column("total").to_pylist()))


def last_written(*epochs: list[tuple[tuple[str | None, int], ...]]) -> dict[str | None, int]:
    """The reference: every row in epoch, task, row order; a later one replaces an earlier."""
    final: dict[str | None, int] = {}
    for parts in epochs:
        for pairs in parts:
            for k, t in pairs:
                final[k] = t
    return final


def staged_files(out: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs
                  if os.path.basename(d).startswith("epoch-"))


def test_a_reader_sees_one_row_per_key_the_last_one_written(out):
    epochs = [
        [(("a", 1), ("b", 1), ("a", 2)), (("c", 1),)],   # a key twice in one task: the later row wins
        [(("b", 5),), (("d", 1),)],
        [(("a", 7), ("c", 3))],
    ]
    sink = new_sink(out)
    run_epoch(sink, 0, *epochs[0])
    sink.commit(checkpoint(sink, 1))
    assert table(out) == last_written(epochs[0])
    run_epoch(sink, 1, *epochs[1])
    run_epoch(sink, 2, *epochs[2])                      # two epochs in one checkpoint
    sink.commit(checkpoint(sink, 2))
    assert table(out) == last_written(*epochs) == {"a": 7, "b": 5, "c": 3, "d": 1}


def test_a_key_written_by_two_tasks_of_one_epoch_takes_the_later_tasks_row(out):
    sink = new_sink(out)
    run_epoch(sink, 0, (("a", 1),), (("a", 2),))
    sink.commit(checkpoint(sink, 1))
    assert table(out) == {"a": 2}


def test_null_keys_are_one_key_and_several_key_columns_make_the_key(out):
    sink = new_sink(out, keys=("k", "w"))

    def rows(*triples):
        return pa.table({"k": pa.array([k for k, _, _ in triples], pa.string()),
                         "w": pa.array([w for _, w, _ in triples], pa.int64()),
                         "total": pa.array([t for _, _, t in triples], pa.int64())})

    for epoch, triples in enumerate([[(None, 0, 1), ("a", 0, 1), ("a", 1, 1)], [(None, 0, 2), ("a", 1, 3)]]):
        sink.stage_epoch(epoch, sink.epoch_writer().write(epoch, 0, rows(*triples)))
        sink.commit(checkpoint(sink, epoch + 1))
    got = read_committed(out).sort_by([("k", "ascending"), ("w", "ascending")]).to_pylist()
    assert got == [{"k": "a", "w": 0, "total": 1}, {"k": "a", "w": 1, "total": 3},
                   {"k": None, "w": 0, "total": 2}]


def test_the_merge_commit_itself_records_the_checkpoint_and_the_merged_epochs(out):
    """One Delta version per checkpoint: the MERGE that changes the rows carries the txn, so
    no crash can leave rows merged without the record that skips them on a retry."""
    sink = new_sink(out)
    run_epoch(sink, 0, (("a", 1),))
    sink.commit(checkpoint(sink, 1))
    run_epoch(sink, 1, (("a", 2), ("b", 1)))
    sink.commit(checkpoint(sink, 2))
    dt = DeltaTable(out)
    assert dt.version() == 1
    assert dt.history(1)[0]["operation"] == "MERGE"
    assert dt.transaction_version(JOB) == 2
    first = DeltaTable(out, version=0)
    assert first.transaction_version(JOB) == 1 and first.to_pyarrow_table().num_rows == 1
    assert sink.committed_epochs() == [0, 1]


def test_a_replayed_commit_is_skipped_and_writes_no_version(out):
    sink = new_sink(out)
    run_epoch(sink, 0, (("a", 1),))
    handle = checkpoint(sink, 1)
    sink.commit(handle)
    version = DeltaTable(out).version()
    sink.commit(handle)
    new_sink(out).recover(handle)
    assert DeltaTable(out).version() == version and table(out) == {"a": 1}


def test_merged_staged_files_are_deleted_after_the_commit(out):
    sink = new_sink(out)
    run_epoch(sink, 0, (("a", 1),), (("b", 1),))
    sink.commit(checkpoint(sink, 1))
    assert staged_files(out) == [], "staged rows of a merged checkpoint are not kept"


def test_an_overlapping_checkpoint_does_not_merge_an_earlier_epoch_again(out):
    """Checkpoint 2 was pre-committed before 1's commit ran, so its handle names epoch 0's
    files too; epoch 0 is merged and its files are gone by the time 2 commits. Epoch 1
    changed key a since: replaying epoch 0 would put the old total back."""
    sink = new_sink(out)
    run_epoch(sink, 0, (("a", 1), ("b", 1)))
    first = checkpoint(sink, 1)
    run_epoch(sink, 1, (("a", 2),))
    second = checkpoint(sink, 2)
    sink.commit(first)
    new_sink(out).recover(second)                       # the process died before committing 2
    assert table(out) == {"a": 2, "b": 1}


def test_a_restore_to_an_older_checkpoint_rewinds_keys_updated_after_it(out):
    sink = new_sink(out)
    run_epoch(sink, 0, (("a", 1), ("b", 1)))
    h1 = checkpoint(sink, 1)
    sink.commit(h1)
    run_epoch(sink, 1, (("a", 5), ("c", 1)))
    sink.commit(checkpoint(sink, 2))
    assert table(out) == {"a": 5, "b": 1, "c": 1}

    again = new_sink(out)
    again.recover(h1)                                   # checkpoint 2 turned out unrestorable
    assert table(out) == {"a": 1, "b": 1}
    assert DeltaTable(out).transaction_version(JOB) == 1 and again.committed_epochs() == [0]
    run_epoch(again, 1, (("a", 5), ("c", 1)))           # epoch 1 again, under checkpoint 3
    again.commit(checkpoint(again, 3))
    assert table(out) == {"a": 5, "b": 1, "c": 1}


def test_a_fresh_start_withdraws_the_merged_rows(out):
    sink = new_sink(out)
    run_epoch(sink, 0, (("a", 1),))
    sink.commit(checkpoint(sink, 4))
    again = new_sink(out)
    assert again.committed_epochs() == [0]
    again.recover(None)                                 # restore.mode=empty
    assert table(out) == {} and again.committed_epochs() == []
    run_epoch(again, 0, (("b", 1),))
    again.commit(checkpoint(again, 1))                  # ids start at 1 again
    assert table(out) == {"b": 1}


# -- bad configuration ------------------------------------------------------------------------
@pytest.mark.parametrize("keys, why", [
    ([], "at least one column"),
    ("k", "a list of column names"),
    (["k", "k"], "more than once"),
    (["k", ""], "non-empty strings"),
    (["k", 3], "non-empty strings"),
])
def test_bad_merge_keys_are_refused_when_the_sink_is_made(tmp_path, keys, why):
    with pytest.raises(ConfigError, match=why) as e:
        DeltaSink(str(tmp_path / "t"), merge_keys=keys)
    assert "\n" not in str(e.value) and "merge_keys" in str(e.value)


def test_merge_keys_that_are_not_output_columns_are_refused_in_one_line(out):
    sink = new_sink(out, keys=("k", "window_start"))
    writer = cloudpickle.loads(cloudpickle.dumps(sink.epoch_writer()))
    with pytest.raises(ConfigError) as e:
        writer.write(0, 0, updates(("a", 1)))
    assert str(e.value) == ("sink delta: merge_keys ['window_start'] are not columns of the output (k, total); "
                            "name the output's key columns in DeltaSink(merge_keys=...)")


def test_a_table_is_not_switched_between_appending_and_merging_on_restore(out):
    appended = DeltaSink(out)
    appended.open(JOB)
    appended.stage_epoch(0, appended.epoch_writer().write(0, 0, updates(("a", 1))))
    handle = checkpoint(appended, 1)
    appended.commit(handle)
    with pytest.raises(ConfigError, match=r"holds rows job job appended .* new table path, or drop merge_keys$"):
        new_sink(out).recover(handle)

    other = os.path.join(os.path.dirname(out), "merged")
    merged = new_sink(other)
    run_epoch(merged, 0, (("a", 1),))
    handle = checkpoint(merged, 1)
    merged.commit(handle)
    plain = DeltaSink(other)
    plain.open(JOB)
    with pytest.raises(ConfigError, match=r"holds rows job job merged by key .* Pass the same merge_keys again"):
        plain.recover(handle)
    assert table(other) == {"a": 1}


def test_top_n_re_emits_merged_by_key_and_rank_equal_the_top_n_of_all_rows(out):
    """TopN writes a key's whole top again whenever an epoch changes it; merged by (key,
    rank), the table is each key's top n over every row so far (computed by pandas)."""
    import random

    import pandas as pd

    from sparkpoint import TopN
    from sparkpoint.testing import ProcessorTester

    rnd = random.Random(3)
    prices = rnd.sample(range(10_000), 400)  # distinct: no ties to break
    bids = pd.DataFrame({"auction": [rnd.randrange(8) for _ in prices], "bidder": [rnd.randrange(50) for _ in prices],
                         "price": prices}).astype("int64")
    tester = ProcessorTester(TopN("top", ["auction"], [("price", "desc")], 3))
    sink = new_sink(out, keys=("auction", "rank"))
    emitted = 0
    for epoch, rows in enumerate([bids.iloc[i:i + 50] for i in range(0, len(bids), 50)]):
        update = pa.Table.from_pandas(tester.process(rows.reset_index(drop=True)), preserve_index=False)
        emitted += update.num_rows
        sink.write_epoch(epoch, update)
        if epoch % 2:
            sink.commit(checkpoint(sink, epoch + 1))
    sink.commit(checkpoint(sink, 100))

    expected = bids.sort_values("price", ascending=False).groupby("auction").head(3).copy()
    expected["rank"] = expected.groupby("auction")["price"].rank(ascending=False).astype("int64")
    got = read_committed(out).to_pandas()
    assert emitted > len(got), "tops were re-emitted (the updates merging folds)"
    cols = ["auction", "rank", "bidder", "price"]
    assert not got.duplicated(["auction", "rank"]).any()
    pd.testing.assert_frame_equal(got[cols].astype("int64").sort_values(cols[:2]).reset_index(drop=True),
                                  expected[cols].sort_values(cols[:2]).reset_index(drop=True))
