"""Exactly-once with checkpoint storage on an S3 API (the run's moto server): a keyed
aggregate crashes in-process (tests/inprocess.py) right after its second checkpoint's
`_metadata` is durable on S3 and before that checkpoint's output is committed; the
restarted run restores it from S3, continues the checkpoint ids, and its committed
update-mode output equals, row for row, what the input alone gives
(tests/e2e/chaos_oracles.py). Every file every checkpoint on S3 references passes
verification (size and sha256). A real SIGKILL with checkpoints on S3 is the Delta
storm of tests/e2e/test_chaos_storm.py."""

from __future__ import annotations

import pytest

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline
from sparkpoint.runtime.status import JobStatus
from sparkpoint.storage.inspect import verify_checkpoints
from tests.e2e.chaos_oracles import aggregate_updates, as_canonical
from tests.e2e.harness import canonical, read_output
from tests.e2e.storage_support import completed_checkpoints, job_storage, state_handles
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = [pytest.mark.spark, pytest.mark.s3]

NAME = "s3crash"
KEYS, TOTAL, PER_EPOCH = 50, 20_000, 2_000  # 10 epochs


def _pipeline(out) -> Pipeline:
    return (Pipeline(NAME)
            .source(GeneratorSource("events", keys=KEYS, total_events=TOTAL, max_records_per_epoch=PER_EPOCH))
            .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
            .sink(ParquetSink(str(out))))


def test_a_crash_with_checkpoints_on_s3_restores_from_s3_exactly_once(spark, tmp_path, s3_server, s3_bucket):
    url = f"s3://{s3_bucket}/ckpt"
    options = s3_server.storage_options()
    settings = job_settings(tmp_path, NAME, **{"execution.checkpointing.dir": url,
                                               "execution.checkpointing.storage-options": options})
    out = tmp_path / "out"
    first = start(_pipeline(out), settings, spark, crash_at=CrashPoint.after_metadata(2)).wait_crashed()
    fs, layout = job_storage(url, {**options, "skip_instance_cache": True}, job_name=NAME)
    before = completed_checkpoints(fs, layout)
    assert len(before) >= 2, f"the crashed run completed two checkpoints on S3: {sorted(before)}"

    second = restart(first, _pipeline(out), spark)
    assert second.wait().status is JobStatus.FINISHED, second.tail()
    assert second.job.restored_from is not None, second.tail()
    assert f"restores checkpoint {max(before)}" in second.text, second.tail()
    assert min(second.job.completed_ids) > max(before), "checkpoint ids continue after the restored one"

    output = read_output(out)
    expected = as_canonical(aggregate_updates(TOTAL, keys=KEYS, per_epoch=PER_EPOCH), output.column_names)
    got = canonical(output, drop=())
    assert len(got) == len(expected), "update rows lost or duplicated"
    assert got == expected

    after = completed_checkpoints(fs, layout)
    assert after and all(state_handles(data) for data in after.values())
    results = verify_checkpoints(fs, layout, after)  # every file of every handle: size and sha256, on S3
    assert results and all(r.ok for r in results), [r for r in results if not r.ok]
