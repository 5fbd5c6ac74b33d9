"""Stores kept open between epochs in Spark's Python workers (kept_stores): another
worker process gets the store by asking for it; a kept handle is never used on a
directory that was replaced. Real processes and real RocksDB stores."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import time

import pyarrow as pa
import pytest

from sparkpoint.errors import LocalStateHeldError
from sparkpoint.runtime.executor import kept_stores
from sparkpoint.state.store import SubtaskStateStore

EMPTY = pa.table({})


@pytest.fixture
def in_task(monkeypatch):
    monkeypatch.setattr(kept_stores, "_in_spark_task", lambda: True)


def _keep_and_wait(db_dir: str, ready, done) -> None:
    """A worker: commits epoch 0, keeps the store open, idles until told to stop."""
    kept_stores._in_spark_task = lambda: True
    store = SubtaskStateStore.open(db_dir)
    kept_stores.opened(db_dir)
    store.put(b"k", b"from-a")
    store.commit_epoch(0, EMPTY)
    kept_stores.keep(db_dir, store)
    ready.set()
    done.wait(60)


def test_another_process_gets_a_kept_store_by_asking_for_it(tmp_path) -> None:
    db_dir = str(tmp_path / "db")
    ctx = mp.get_context("spawn")  # a forked child inherits RocksDB thread pools without their threads
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_keep_and_wait, args=(db_dir, ready, done))
    holder.start()
    try:
        assert ready.wait(30)
        assert not kept_stores._lock_free(db_dir), "the holder keeps RocksDB's lock while it idles"
        started = time.monotonic()
        kept_stores.release(db_dir, timeout_s=20)
        assert time.monotonic() - started < 5
        with SubtaskStateStore.open(db_dir, create=False) as store:
            assert store.epoch() == 0 and store.get(b"k") == b"from-a"
    finally:
        done.set()
        holder.join(30)


def test_a_dead_holder_is_not_waited_for(tmp_path) -> None:
    db_dir = str(tmp_path / "db")
    ctx = mp.get_context("spawn")  # a forked child inherits RocksDB thread pools without their threads
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_keep_and_wait, args=(db_dir, ready, done))
    holder.start()
    assert ready.wait(30)
    holder.kill()
    holder.join(30)
    started = time.monotonic()
    kept_stores.release(db_dir, timeout_s=20)
    assert time.monotonic() - started < 1
    with SubtaskStateStore.open(db_dir, create=False) as store:
        # No WAL: epoch 0 died in the holder's memtable unless RocksDB flushed it; the
        # runtime catches up from the change log. Either way the store is a whole epoch.
        assert (store.epoch(), store.get(b"k")) in ((-1, None), (0, b"from-a"))


def test_a_kept_store_is_used_again_only_for_the_same_directory(tmp_path, in_task) -> None:
    db_dir = str(tmp_path / "db")
    store = SubtaskStateStore.open(db_dir)
    kept_stores.opened(db_dir)
    store.put(b"k", b"v1")
    store.commit_epoch(0, EMPTY)
    kept_stores.keep(db_dir, store)
    again = kept_stores.take(db_dir)
    assert again is store and again.get(b"k") == b"v1"
    kept_stores.keep(db_dir, again)

    # Replaced meanwhile by something else (another process, a person):
    rebuild = mp.get_context("spawn").Process(target=_replace, args=(db_dir,))
    rebuild.start()
    rebuild.join(30)
    assert rebuild.exitcode == 0
    assert kept_stores.take(db_dir) is None, "the old handle points at deleted files"


def _replace(db_dir: str) -> None:
    shutil.rmtree(db_dir)
    with SubtaskStateStore.open(db_dir) as other:
        other.put(b"k", b"v2")
        other.commit_epoch(5, EMPTY)


def test_uncommitted_writes_are_not_kept(tmp_path, in_task) -> None:
    db_dir = str(tmp_path / "db")
    store = SubtaskStateStore.open(db_dir)
    kept_stores.opened(db_dir)
    store.put(b"k", b"half-done")
    kept_stores.keep(db_dir, store)
    again = kept_stores.take(db_dir)
    assert again.get(b"k") is None and again.pending_writes == 0
    kept_stores.close(db_dir, again)


def test_outside_a_spark_task_nothing_is_kept(tmp_path) -> None:
    db_dir = str(tmp_path / "db")
    store = SubtaskStateStore.open(db_dir)
    kept_stores.opened(db_dir)
    kept_stores.keep(db_dir, store)
    assert kept_stores.take(db_dir) is None
    with SubtaskStateStore.open(db_dir, create=False):  # not locked: it was closed
        pass


# -- a store another worker still has open is never opened twice or replaced ---------------
def _hold_in_a_running_task(db_dir: str, ready, commit, done) -> None:
    """A worker whose task still uses the store (it is not idle, so it does not give it
    up when asked): commits epoch 0, then, when told, epoch 1, then closes (a flush)."""
    kept_stores._in_spark_task = lambda: True
    store = SubtaskStateStore.open(db_dir)
    kept_stores.opened(db_dir)
    store.put(b"k", b"holder-0")
    store.commit_epoch(0, EMPTY)
    ready.set()
    commit.wait(60)
    store.put(b"k", b"holder-1")
    for i in range(2000):  # enough to make the close write an SST file of its own
        store.put(b"n%05d" % i, b"x" * 100)
    store.commit_epoch(1, EMPTY)
    kept_stores.close(db_dir, store)
    done.set()


def _start_holder(db_dir: str):
    ctx = mp.get_context("spawn")
    ready, commit, done = ctx.Event(), ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_in_a_running_task, args=(db_dir, ready, commit, done))
    holder.start()
    assert ready.wait(30)
    return holder, commit, done


def test_a_release_that_times_out_fails_the_task(tmp_path) -> None:
    db_dir = str(tmp_path / "db")
    holder, commit, done = _start_holder(db_dir)
    try:
        with pytest.raises(LocalStateHeldError, match="still held"):
            kept_stores.release(db_dir, timeout_s=0.5)
        assert not os.path.exists(db_dir + ".release"), "the request is withdrawn"
    finally:
        commit.set()
        holder.join(30)


def test_a_store_directory_whose_lock_is_held_is_never_removed(tmp_path) -> None:
    """A rebuild on this worker while another worker's task still has the store open:
    the rebuild fails, and the holder's later flush lands in its own store, whole."""
    from sparkpoint.runtime.executor.state import SubtaskState, fresh_lineage
    from sparkpoint.runtime.executor.storage import StorageRef

    root = tmp_path / "state"
    lineage = fresh_lineage("totals", 0, 1, 4)
    state = SubtaskState(str(root), lineage, *StorageRef(str(tmp_path / "chk"), "job").open())
    holder, commit, done = _start_holder(state.db_dir)
    try:
        kept_stores_timeout = kept_stores.RELEASE_TIMEOUT_S
        kept_stores.RELEASE_TIMEOUT_S = 0.5
        try:
            with pytest.raises(LocalStateHeldError, match="still held"):
                state.open(0, trust_local=False)   # must rebuild: it would remove the directory
        finally:
            kept_stores.RELEASE_TIMEOUT_S = kept_stores_timeout
            state.close()
    finally:
        commit.set()
        assert done.wait(30)
        holder.join(30)
    with SubtaskStateStore.open(state.db_dir, create=False) as store:
        assert store.epoch() == 1 and store.get(b"k") == b"holder-1"
        assert len(list(store.scan_prefix(b"n"))) == 2000


def test_a_kept_store_whose_directory_was_replaced_while_in_use_is_not_handed_out_again(tmp_path, in_task) -> None:
    """The identity that proves a kept handle is the directory's is taken when the store
    is opened: a directory replaced while the task ran is not the store's."""
    db_dir = str(tmp_path / "db")
    store = SubtaskStateStore.open(db_dir)
    kept_stores.opened(db_dir)
    store.put(b"k", b"v1")
    store.commit_epoch(0, EMPTY)
    rebuild = mp.get_context("spawn").Process(target=_replace, args=(db_dir,))
    rebuild.start()
    rebuild.join(30)
    assert rebuild.exitcode == 0
    kept_stores.keep(db_dir, store)     # the task ends
    assert kept_stores.take(db_dir) is None, "the old handle points at deleted files"
    with SubtaskStateStore.open(db_dir, create=False) as other:
        assert other.epoch() == 5 and other.get(b"k") == b"v2"
