"""The storage side of savepoints fails with one clear, typed error: an incomplete copy is
never completed, an existing savepoint is never overwritten, and a directory that is
not a savepoint is refused as a restore source."""

from __future__ import annotations

import hashlib

import pytest

from sparkpoint.checkpoint.interfaces import CheckpointProperties, CompletedCheckpointData
from sparkpoint.errors import ConfigError, CorruptCheckpointError, MetadataExistsError
from sparkpoint.storage import savepoints
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout


def _data(path: str, raw: bytes) -> CompletedCheckpointData:
    entry = {"path": path, "size": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "shared": True,
             "name": path.rsplit("/", 1)[-1]}
    return CompletedCheckpointData("job", 7, 1, 2, {"state:op/0": {"changelog": {"files": [entry]}}},
                                   CheckpointProperties(forced=True, periodic=False, savepoint=True))


def _location(tmp_path, name="sp"):
    fs = StorageFS.from_url(str(tmp_path))
    return savepoints.target_fs(fs, JobLayout(f"{fs.root}/job"), 7, str(tmp_path / name), None)


def test_a_savepoint_missing_a_state_file_is_not_completed(tmp_path):
    fs, location = _location(tmp_path)
    savepoints.initialize(fs, location)
    with pytest.raises(CorruptCheckpointError, match="incomplete: 1 of 1 state files were not copied"):
        savepoints.commit(fs, location, _data("shared/state/op/0/log/1.changelog", b"abc"))
    assert not (tmp_path / "sp" / "_metadata").exists()


def test_a_complete_savepoint_is_written_and_never_overwritten(tmp_path):
    fs, location = _location(tmp_path)
    savepoints.initialize(fs, location)
    copy = tmp_path / "sp" / "shared/state/op/0/log/1.changelog"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(b"abc")
    savepoints.commit(fs, location, _data("shared/state/op/0/log/1.changelog", b"abc"))
    data, parent, name = savepoints.read(str(tmp_path / "sp"))
    assert data.properties.savepoint and (parent, name) == (str(tmp_path), "sp")
    with pytest.raises(MetadataExistsError, match="already holds a savepoint"):
        savepoints.initialize(*_location(tmp_path))


def test_a_directory_without_metadata_is_refused_as_a_savepoint(tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(ConfigError, match="is not a savepoint or checkpoint"):
        savepoints.read(str(tmp_path / "half"))
