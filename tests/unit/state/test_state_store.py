from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
import rocksdict

from sparkpoint.errors import ForeignCheckpointError, StaleStateError
from sparkpoint.state.store import SubtaskStateStore


def out(epoch: int) -> pa.Table:
    return pa.table({"epoch": [epoch], "text": [f"output of {epoch}"]})


def test_fresh_store_has_no_epoch_and_no_output(tmp_path: Path) -> None:
    with SubtaskStateStore.open(str(tmp_path / "s")) as store:
        assert store.epoch() == -1
        assert store.last_output() is None


def test_commit_is_visible_after_reopen_with_marker_and_output(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with SubtaskStateStore.open(path) as store:
        store.put(b"\x00\x01a", b"1")
        store.put_many([b"\x00\x01b", b"\x00\x01c"], [b"2", b"3"])
        store.commit_epoch(0, out(0))
    with SubtaskStateStore.open(path, create=False) as store:
        assert store.epoch() == 0
        assert store.get_many([b"\x00\x01a", b"\x00\x01b", b"\x00\x01c", b"\x00\x01d"]) == [b"1", b"2", b"3", None]
        assert store.last_output().equals(out(0))


def test_uncommitted_writes_vanish_and_state_stays_at_previous_epoch(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with SubtaskStateStore.open(path) as store:
        store.put(b"\x00\x00k", b"old")
        store.commit_epoch(4, out(4))
    with SubtaskStateStore.open(path) as store:
        store.put(b"\x00\x00k", b"new")
        store.put(b"\x00\x00other", b"x")
        assert store.get(b"\x00\x00k") == b"new"  # read-your-writes within the epoch
        # closed without commit_epoch: a crash or an exception in apply
    with SubtaskStateStore.open(path) as store:
        assert store.epoch() == 4
        assert store.get(b"\x00\x00k") == b"old"
        assert store.get(b"\x00\x00other") is None
        assert store.last_output().equals(out(4))


def test_reads_see_buffered_puts_and_deletes_in_key_order(tmp_path: Path) -> None:
    with SubtaskStateStore.open(str(tmp_path / "s")) as store:
        store.put_many([b"p/a", b"p/c", b"p/e", b"q/a"], [b"1", b"3", b"5", b"x"])
        store.commit_epoch(0, out(0))
        store.put(b"p/b", b"2")
        store.delete(b"p/c")
        store.put(b"p/e", b"55")
        store.put(b"p/f", b"6")
        assert list(store.scan_prefix(b"p/")) == [(b"p/a", b"1"), (b"p/b", b"2"), (b"p/e", b"55"), (b"p/f", b"6")]
        assert store.get_many([b"p/a", b"p/c", b"p/e"]) == [b"1", None, b"55"]
        assert list(store.scan_range(b"p/b", b"p/f")) == [(b"p/b", b"2"), (b"p/e", b"55")]
        assert store.has_prefix(b"q/") and not store.has_prefix(b"r/")


def test_an_epoch_is_committed_once(tmp_path: Path) -> None:
    with SubtaskStateStore.open(str(tmp_path / "s")) as store:
        store.commit_epoch(2, out(2))
        with pytest.raises(StaleStateError, match="already at epoch 2"):
            store.commit_epoch(2, out(2))


def test_missing_state_with_create_false_is_stale(tmp_path: Path) -> None:
    with pytest.raises(StaleStateError, match="restore this subtask"):
        SubtaskStateStore.open(str(tmp_path / "nothing"), create=False)


def test_format_record_is_checked_on_open(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    SubtaskStateStore.open(path, operator="counts", key_groups=range(0, 64), max_parallelism=128).close()
    with pytest.raises(ForeignCheckpointError, match="belongs to operator 'counts'"):
        SubtaskStateStore.open(path, operator="windows")
    with pytest.raises(StaleStateError, match="key-group range"):
        SubtaskStateStore.open(path, operator="counts", key_groups=range(64, 128))
    with pytest.raises(StaleStateError, match="max parallelism"):
        SubtaskStateStore.open(path, operator="counts", max_parallelism=256)
    SubtaskStateStore.open(path, operator="counts", key_groups=range(0, 64), max_parallelism=128).close()


def test_a_foreign_rocksdb_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "foreign")
    db = rocksdict.Rdict(path, rocksdict.Options(raw_mode=True))
    db[b"somebody"] = b"else"
    db.close()
    with pytest.raises(ForeignCheckpointError, match="without a sparkpoint format record"):
        SubtaskStateStore.open(path)


def test_local_checkpoint_opens_as_a_store_with_the_committed_state(tmp_path: Path) -> None:
    path, chk = str(tmp_path / "s"), str(tmp_path / "chk" / "op" / "0" / "chk-7")
    with SubtaskStateStore.open(path, operator="op") as store:
        store.put(b"\x00\x00k", b"v1")
        store.commit_epoch(1, out(1))
        store.create_local_checkpoint(chk)
        store.put(b"\x00\x00k", b"v2")
        store.commit_epoch(2, out(2))
        with pytest.raises(FileExistsError):
            store.create_local_checkpoint(chk)
        store.put(b"\x00\x00k", b"v3")
        with pytest.raises(StaleStateError, match="uncommitted"):
            store.create_local_checkpoint(str(tmp_path / "chk2"))
    with SubtaskStateStore.open(chk, create=False, operator="op") as restored:
        assert restored.epoch() == 1
        assert restored.get(b"\x00\x00k") == b"v1"
        assert restored.last_output().equals(out(1))


def test_a_sigkill_leaves_the_store_at_a_whole_epoch_no_older_than_its_last_flush(tmp_path: Path) -> None:
    """Without a WAL the epochs still in the memtable die with the process (the runtime
    catches up from their change logs, test_executor_state.py); what must hold is that
    the store reopens at one whole epoch: every key as that epoch wrote it, never part
    of a later one. A 1 MB write buffer makes RocksDB switch memtables mid-run, so the
    store on disk is a mix of flushed and lost batches."""
    path = str(tmp_path / "s")
    script = textwrap.dedent(f"""
        import os, signal
        import pyarrow as pa
        from sparkpoint.state.store import StoreOptions, SubtaskStateStore
        store = SubtaskStateStore.open({path!r}, options=StoreOptions(write_buffer_size_mb=1))
        keys = [b"\\x00\\x00%05d" % i for i in range(5000)]
        for epoch in range(12):
            store.put_many(keys, [b"e%02d" % epoch + b"." * 200] * len(keys))
            store.commit_epoch(epoch, pa.table({{"epoch": [epoch]}}))
            if epoch == 3:
                store.create_local_checkpoint({str(tmp_path / "chk")!r})  # flushes
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    with SubtaskStateStore.open(path) as store:
        epoch = store.epoch()
        assert 3 <= epoch <= 11
        values = {store.get(b"\x00\x00%05d" % i)[:3] for i in range(5000)}
        assert values == {b"e%02d" % epoch}
        assert store.last_output().column("epoch").to_pylist() == [epoch]


def test_committed_epochs_survive_close_and_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with SubtaskStateStore.open(path) as store:
        for epoch in range(3):
            store.put_many([b"\x00\x00%d" % i for i in range(1000)], [b"v%d" % epoch] * 1000)
            store.commit_epoch(epoch, pa.table({"n": [epoch]}))
    with SubtaskStateStore.open(path) as store:
        assert store.epoch() == 2
        assert store.get(b"\x00\x00999") == b"v2"


def test_scans_without_an_upper_bound_never_return_store_metadata(tmp_path: Path) -> None:
    with SubtaskStateStore.open(str(tmp_path / "s")) as store:
        store.put(b"\x00\x05a", b"1")
        store.put_meta("dropped", b"\x00")
        store.commit_epoch(0, out(0))
        store.put(b"\x00\x06b", b"2")
        store.put_meta("dropped", b"\x01")
        assert list(store.scan_range(b"\x00", None)) == [(b"\x00\x05a", b"1"), (b"\x00\x06b", b"2")]
        assert store.get_meta("dropped") == b"\x01"


def test_corrupt_local_files_mean_stale_state_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SubtaskStateStore.open(str(path)) as store:
        store.put(b"\x00\x00k", b"v" * 100)
        store.commit_epoch(0, out(0))
        store.create_local_checkpoint(str(tmp_path / "copy"))  # flushes an SST we can damage
    for sst in (tmp_path / "copy").glob("*.sst"):
        sst.write_bytes(b"garbage" * 10)
    with pytest.raises(StaleStateError, match="restores this subtask from a checkpoint"):
        with SubtaskStateStore.open(str(tmp_path / "copy")) as store:
            store.get(b"\x00\x00k")


def test_scans_interleaved_with_writes_match_a_sorted_dict(tmp_path: Path) -> None:
    """Windows scan each key group and write (fire, delete, add) between scans: every scan
    sees exactly the committed entries merged with the epoch's writes so far."""
    import random

    rng = random.Random(7)
    committed = {bytes([rng.randrange(8), rng.randrange(256)]): b"c" for _ in range(300)}
    with SubtaskStateStore.open(str(tmp_path / "s")) as store:
        store.put_many(list(committed), list(committed.values()))
        store.commit_epoch(0, pa.table({}))
        expected = dict(committed)
        for step in range(400):
            op = rng.random()
            key = bytes([rng.randrange(8), rng.randrange(256)])
            if op < 0.4:
                store.put(key, b"p%d" % step)
                expected[key] = b"p%d" % step
            elif op < 0.6:
                store.delete(key)
                expected.pop(key, None)
            elif op < 0.7:
                keys = [bytes([rng.randrange(8), rng.randrange(256)]) for _ in range(5)]
                store.put_many(keys, [b"m"] * 5)
                expected.update(dict.fromkeys(keys, b"m"))
            else:
                lo = rng.randrange(8)
                start, stop = bytes([lo]), (bytes([lo + rng.randrange(1, 3)]) if rng.random() < 0.8 else None)
                want = sorted((k, v) for k, v in expected.items() if k >= start and (stop is None or k < stop))
                assert list(store.scan_range(start, stop)) == want, step


@pytest.mark.parametrize("cache_entries", [0, 16, 1_000_000])
def test_point_reads_through_the_read_cache_match_a_model_across_commits_and_discards(
        tmp_path: Path, cache_entries: int) -> None:
    """The read cache answers committed values without RocksDB: after commits, deletes,
    discarded epochs, a cache cleared because it filled up and a reopen, every get and
    get_many still returns exactly what was committed (plus the epoch's own writes)."""
    import dataclasses
    import random

    from sparkpoint.state.store import StoreOptions

    rng = random.Random(11)
    options = dataclasses.replace(StoreOptions(), read_cache_entries=cache_entries)
    path = str(tmp_path / "s")
    committed: dict[bytes, bytes] = {}
    universe = [b"\x00\x01" + bytes([i]) for i in range(64)]
    store = SubtaskStateStore.open(path, options=options)
    try:
        for epoch in range(40):
            pending = dict(committed)
            for step in range(rng.randrange(1, 30)):
                key = rng.choice(universe)
                if rng.random() < 0.7:
                    value = b"e%d-%d" % (epoch, step)
                    store.put(key, value)
                    pending[key] = value
                else:
                    store.delete(key)
                    pending.pop(key, None)
                probe = rng.sample(universe, 8)
                assert store.get_many(probe) == [pending.get(k) for k in probe], (epoch, step)
                assert store.get(probe[0]) == pending.get(probe[0])
            if rng.random() < 0.25:
                store.discard_pending()  # the epoch failed: its writes never happened
            else:
                store.commit_epoch(epoch, out(epoch))
                committed = pending
            assert store.get_many(universe) == [committed.get(k) for k in universe], epoch
            if epoch % 13 == 12:  # another task opens it: nothing read before may linger
                store.close()
                store = SubtaskStateStore.open(path, options=options)
    finally:
        store.close()
