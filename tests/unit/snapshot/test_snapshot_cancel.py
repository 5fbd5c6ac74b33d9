"""An aborted checkpoint's upload stops writing (seed 000: its directory is deleted
only once its writers have stopped)."""

from __future__ import annotations

import threading
from pathlib import Path

from snapshot_support import Remote, local_checkpoint, open_db, put_keys

from sparkpoint.errors import SnapshotCancelled
from sparkpoint.state.upload import upload_snapshot
from sparkpoint.storage.fs import StorageFS

WAIT_S = 30  # a safety net for a broken implementation, never reached when it works


class PutGate(StorageFS):
    """Holds the 2nd upload until `release` is set, so a test can cancel mid-upload."""

    def __init__(self, inner: StorageFS, release: threading.Event):
        super().__init__(inner.fs, inner.root)
        self.release = release
        self.second_put_started = threading.Event()
        self.puts: list[str] = []

    def put_file(self, local_path: str, path: str) -> None:
        self.puts.append(path)
        if len(self.puts) == 2:
            self.second_put_started.set()
            self.release.wait(WAIT_S)
        super().put_file(local_path, path)


def test_cancelled_upload_stops_writing(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    put_keys(db, range(20_000), seed=1)
    chk = local_checkpoint(db, tmp_path / "chk-1")
    db.close()
    assert len(list(chk.iterdir())) > 3
    cancel = threading.Event()
    gated = PutGate(remote.fs, release=cancel)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            upload_snapshot(str(chk), gated, remote.layout, 1, "counts/0", cancel=cancel)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome.append(e)

    uploader = threading.Thread(target=run)
    uploader.start()
    assert gated.second_put_started.wait(WAIT_S)
    cancel.set()  # the checkpoint is aborted while the 2nd file is being written
    uploader.join(WAIT_S)

    assert not uploader.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], SnapshotCancelled)
    assert "checkpoint 1" in str(outcome[0])
    assert len(gated.puts) == 2
    assert len(remote.all_files()) == 2


def test_upload_cancelled_before_it_starts_writes_nothing(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    put_keys(db, range(100), seed=1)
    chk = local_checkpoint(db, tmp_path / "chk-1")
    db.close()
    cancel = threading.Event()
    cancel.set()
    try:
        upload_snapshot(str(chk), remote.fs, remote.layout, 1, "counts/0", cancel=cancel)
    except SnapshotCancelled:
        pass
    else:
        raise AssertionError("upload ran although its checkpoint was aborted")
    assert remote.all_files() == set()
