"""What a checkpoint or a commit relies on is on disk before it is
referenced: uploaded state files and staged Parquet output are fsynced (file and
directory), and an upload is atomic (a file at a content address is whole)."""

from __future__ import annotations

import os

import pyarrow as pa

from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.storage.fs import StorageFS


def _record_fsyncs(monkeypatch) -> list[str]:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_an_uploaded_state_file_is_fsynced_and_renamed_into_place(tmp_path, monkeypatch):
    local = tmp_path / "000012.sst"
    local.write_bytes(b"x" * 1000)
    fs = StorageFS.from_url(str(tmp_path / "checkpoints"))
    target = f"{fs.root}/job/shared/state/op/0/abc-000012.sst"
    synced = _record_fsyncs(monkeypatch)
    fs.put_file(str(local), target)
    assert open(target, "rb").read() == b"x" * 1000
    assert any(".tmp-" in p and "abc-000012.sst" in p for p in synced), synced  # the data, before the rename
    assert os.path.dirname(target) in synced                                    # the rename itself
    assert not [n for n in os.listdir(os.path.dirname(target)) if ".tmp-" in n]


def test_staged_parquet_output_is_fsynced_before_its_handle_is_returned(tmp_path, monkeypatch):
    sink = ParquetSink(str(tmp_path / "out"))
    sink.open("job")
    synced = _record_fsyncs(monkeypatch)
    [handle] = sink.epoch_writer().write(3, 1, pa.table({"k": [1, 2]}))
    staged = os.path.join(sink.path, handle["path"])
    assert os.path.exists(staged)
    assert any(p.endswith(".parquet") or ".tmp" in p for p in synced), synced
    assert os.path.dirname(staged) in synced
