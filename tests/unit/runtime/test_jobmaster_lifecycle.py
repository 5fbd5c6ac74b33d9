"""JobMaster's life cycle without Spark: a set-up that fails half-way leaves no lease
behind, and SIGUSR1 only hands the request to another thread."""

from __future__ import annotations

import os
import queue
import signal
import threading

import pytest

from sparkpoint import GeneratorSource, KeyedAggregate, Pipeline
from sparkpoint.config import Settings
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.jobmaster import JobMaster


class BrokenSink(ParquetSink):
    def open(self, job_name: str) -> None:
        raise ConfigError("the output topic does not exist")


def _job(tmp_path, name: str, sink: ParquetSink) -> tuple[Pipeline, Settings]:
    pipeline = (Pipeline(name).source(GeneratorSource("g", keys=10, total_events=10))
                .stateful(KeyedAggregate("agg", ["key"], "value", value_type="bigint"))
                .sink(sink))
    settings = Settings.load(None, [f"execution.checkpointing.dir={tmp_path / 'chk'}",
                                    f"state.local.dir={tmp_path / 'state'}", "sparkpoint.progress=false"],
                             base={"pipeline.name": name})
    return pipeline, settings


def test_a_setup_that_fails_half_way_releases_the_lease_so_the_next_run_is_not_refused(tmp_path):
    pipeline, settings = _job(tmp_path, "halfway", BrokenSink(str(tmp_path / "out")))
    for _ in range(2):  # the second run meets the same sink error, not "job is held by run ..."
        with pytest.raises(ConfigError, match="output topic does not exist"):
            JobMaster(pipeline, settings, spark=object()).run()
    assert not [t for t in threading.enumerate() if t.name == "sparkpoint-lease-keeper"]


def test_sigusr1_triggers_the_checkpoint_on_another_thread_never_inside_the_handler():
    job = object.__new__(JobMaster)
    job._requests = queue.SimpleQueue()
    ran_on: list[threading.Thread] = []
    done = threading.Event()
    job.trigger_checkpoint = lambda: (ran_on.append(threading.current_thread()), done.set())
    previous = job._install_signal_handlers()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert done.wait(5)
        assert ran_on[0] is not threading.main_thread()
    finally:
        job._requests.put(None)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class RecordingSink(ParquetSink):
    recovered: list = []

    def recover(self, handle):
        RecordingSink.recovered.append(handle)
        super().recover(handle)


def test_a_run_fenced_out_before_it_restores_never_touches_the_sinks_output(tmp_path):
    """A run that lost its lease must not recover (delete staged output of)
    the sink the new holder uses."""
    from sparkpoint.errors import LeaseLostError
    from sparkpoint.storage.lease import LeaseRecord

    class TakenOver(JobMaster):
        def _restore(self):
            mine = self.storage.lease.record
            newer = LeaseRecord(mine.job_name, "newer-run", "other-host", 1, mine.token + 1,
                                mine.acquired_ms, mine.heartbeat_ms, mine.ttl_ms)
            self.storage.fs.write_atomic(self.storage.layout.lease_token(mine.token + 1), newer.encode())
            super()._restore()

    RecordingSink.recovered = []
    pipeline, settings = _job(tmp_path, "fenced", RecordingSink(str(tmp_path / "out")))
    with pytest.raises(LeaseLostError, match="fenced out"):
        TakenOver(pipeline, settings, spark=object()).run()
    assert RecordingSink.recovered == []
