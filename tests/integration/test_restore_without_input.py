"""A job restored while its source has nothing new to read still checkpoints.

Found by the Kafka chaos test in CI: the job restarted after SIGKILLs had already read
everything, the broker went away, and no checkpoint completed for minutes. The first
epoch after a restore is what marks the state participants as running again; with no
input no epoch ran, so every trigger was refused as NOT_ALL_REQUIRED_TASKS_RUNNING
and a second failure could not fall back to anything newer than the restored
checkpoint."""

from __future__ import annotations

import json
import threading
import time

import pytest

from sparkpoint import KeyedAggregate, Pipeline
from sparkpoint.config import Settings
from sparkpoint.connectors.files import FileSource
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.runtime.jobmaster import JobMaster

pytestmark = pytest.mark.spark


def _pipeline(root) -> Pipeline:
    return (Pipeline("idle-after-restore")
            .source(FileSource(str(root / "in"), schema="key string, value long"))
            .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
            .sink(ParquetSink(str(root / "out"))))


def _settings(root) -> Settings:
    return Settings.load(overrides={
        "pipeline.name": "idle-after-restore",
        "execution.checkpointing.dir": str(root / "checkpoints"),
        "state.local.dir": str(root / "state"),
        "execution.checkpointing.interval": "300 ms",
        "parallelism.default": 2,
        "sparkpoint.progress": False,
    })


class Watched(JobMaster):
    def _setup(self) -> None:
        super()._setup()
        self.completed: list[int] = []

    def _on_checkpoint_complete(self, checkpoint_id, data) -> None:
        self.completed.append(checkpoint_id)
        super()._on_checkpoint_complete(checkpoint_id, data)


def _run_until(job: Watched, done, timeout_s: float) -> bool:
    thread = threading.Thread(target=job.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if getattr(job, "completed", None) is not None and done(job):
                return True
            time.sleep(0.1)
        return False
    finally:
        job.cancel()
        thread.join(60)


def test_a_job_restored_with_no_new_input_completes_checkpoints(spark, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.json").write_text(
        "\n".join(json.dumps({"key": f"k{i % 7}", "value": i}) for i in range(100)) + "\n")
    first = Watched(_pipeline(tmp_path), _settings(tmp_path), spark=spark)
    # Past the first epoch (which read the file), so the restore has state to bring back.
    assert _run_until(first, lambda j: j.epoch >= 1 and len(j.completed) >= 2, 120), "first run never checkpointed"

    second = Watched(_pipeline(tmp_path), _settings(tmp_path), spark=spark)
    restored_ok = _run_until(second, lambda j: j.restored_from is not None and len(j.completed) >= 1, 60)
    assert second.restored_from is not None
    assert restored_ok, ("no checkpoint completed after a restore with no new input; stats: "
                         f"{second.coordinator.stats.snapshot()}")
