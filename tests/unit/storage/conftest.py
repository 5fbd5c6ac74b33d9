from __future__ import annotations

from pathlib import Path

import pytest
from storage_support import ManualClock, local_job

from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def job(tmp_path: Path) -> tuple[StorageFS, JobLayout]:
    return local_job(tmp_path)


@pytest.fixture
def storage(job: tuple[StorageFS, JobLayout], clock: ManualClock) -> FsCheckpointStorage:
    fs, layout = job
    return FsCheckpointStorage(fs, layout, clock=clock)
