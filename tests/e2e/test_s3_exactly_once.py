"""Exactly-once with checkpoint storage on an S3 API (a moto server
on 127.0.0.1): a real pipeline process is SIGKILLed after it completed checkpoints on
S3, restarted, and its committed output equals what the input alone says it must be."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sparkpoint.storage.inspect import verify_checkpoints
from tests.e2e.harness import canonical
from tests.e2e.storage_support import (
    completed_checkpoints,
    completed_ids,
    job_storage,
    expected_updates,
    make_job,
    state_handles,
)

pytestmark = pytest.mark.e2e


def test_sigkill_and_restart_with_checkpoints_on_s3_is_exactly_once(tmp_path: Path, s3_server,
                                                                      s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/ckpt"
    s3_options = s3_server.storage_options()  # as s3fs takes them: execution.checkpointing.storage-options
    job = make_job(tmp_path / "job", checkpoint_dir=url,
                   sets=[f"execution.checkpointing.storage-options={json.dumps(s3_options)}"])

    first = job.start()
    deadline = time.monotonic() + 300
    while first.count(r"completed checkpoint \d+ of job") < 2:
        assert first.popen.poll() is None, first.text[-3000:]
        assert time.monotonic() < deadline, first.text[-3000:]
        time.sleep(0.2)
    first.kill9()
    fs, layout = job_storage(url, {**s3_options, "skip_instance_cache": True})
    before = completed_checkpoints(fs, layout)
    assert before, "the killed run completed checkpoints on S3"

    second = job.run(timeout=300)

    assert second.popen.returncode == 0, second.text[-3000:]
    assert f"restores checkpoint {max(before)}" in second.text
    assert min(completed_ids(second)) > max(before)
    output = job.output()
    assert canonical(output, drop=()) == expected_updates(output.column_names)
    after = completed_checkpoints(fs, layout)
    assert after and all(state_handles(data) for data in after.values())
    results = verify_checkpoints(fs, layout, after)  # every file of every handle: size and sha256, on S3
    assert results and all(r.ok for r in results), [r for r in results if not r.ok]
