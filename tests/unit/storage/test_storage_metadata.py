"""The `_metadata` format: round trip, and every way a reader must refuse a file."""

from __future__ import annotations

import json

import pytest

from sparkpoint.checkpoint.interfaces import CheckpointProperties, CompletedCheckpointData
from sparkpoint.errors import CorruptCheckpointError, ForeignCheckpointError, MetadataEncodeError
from sparkpoint.storage import metadata

DATA = CompletedCheckpointData(
    job_name="orders", checkpoint_id=42, trigger_timestamp_ms=1_700_000_000_000,
    completion_timestamp_ms=1_700_000_000_250,
    handles={"job": {"epoch": 17, "watermark_ms": None},
             "source:kafka": {"positions": {"orders-0": 1234, "orders-1": 99}},
             "state:windows/3": {"files": [{"path": "shared/state/windows/3/ab-000012.sst", "size": 10,
                                            "sha256": "00" * 32, "shared": True, "name": "000012.sst"}],
                                 "ratio": 0.25, "unicode": "grüße"}},
    properties=CheckpointProperties(forced=True, periodic=False))


def test_round_trip_preserves_everything() -> None:
    assert metadata.decode(metadata.encode(DATA), expected_job="orders") == DATA


def test_file_names_its_format_and_version_first() -> None:
    raw = metadata.encode(DATA)
    assert raw.lstrip().startswith(b'{\n "format": "sparkpoint-checkpoint",\n "version": 1')


@pytest.mark.parametrize("cut", [0, 1, 50, -2])
def test_truncated_file_is_corrupt(cut: int) -> None:
    raw = metadata.encode(DATA)
    with pytest.raises(CorruptCheckpointError, match="chk-42/_metadata"):
        metadata.decode(raw[:cut] if cut >= 0 else raw[:cut - 10], source="chk-42/_metadata")


def test_edited_value_fails_the_checksum() -> None:
    doc = json.loads(metadata.encode(DATA))
    doc["body"]["handles"]["source:kafka"]["positions"]["orders-0"] = 1
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        metadata.decode(json.dumps(doc).encode())


def test_reformatted_but_identical_content_still_verifies() -> None:
    doc = json.loads(metadata.encode(DATA))
    assert metadata.decode(json.dumps(doc, indent=4, sort_keys=False).encode()) == DATA


def test_flink_style_binary_metadata_is_refused_as_not_ours() -> None:
    with pytest.raises(CorruptCheckpointError, match="another program"):
        metadata.decode(b"\x00\x00\x00\x03\xca\xfe\xba\xbe")


def test_json_of_another_program_is_foreign() -> None:
    with pytest.raises(ForeignCheckpointError, match="not a sparkpoint checkpoint"):
        metadata.decode(b'{"format": "flink", "version": 3}')


def test_future_version_is_foreign_and_says_upgrade() -> None:
    doc = json.loads(metadata.encode(DATA))
    doc["version"] = 2
    with pytest.raises(ForeignCheckpointError, match="version 2.*upgrade"):
        metadata.decode(json.dumps(doc).encode())


def test_other_jobs_checkpoint_is_foreign() -> None:
    with pytest.raises(ForeignCheckpointError, match="belongs to job 'orders', not 'payments'"):
        metadata.decode(metadata.encode(DATA), expected_job="payments")


def test_non_json_handle_is_refused_naming_the_participant() -> None:
    bad = CompletedCheckpointData("orders", 1, 0, 0, {"sink:delta": {"txn": object()}})
    with pytest.raises(MetadataEncodeError, match="sink:delta"):
        metadata.encode(bad)


# -- whether a savepoint ended its job ----------------------------------------------------
def _savepoint(terminate: bool) -> CompletedCheckpointData:
    return CompletedCheckpointData(
        job_name="orders", checkpoint_id=43, trigger_timestamp_ms=1, completion_timestamp_ms=2,
        handles={"job": {"epoch": 17}},
        properties=CheckpointProperties(forced=True, periodic=False, savepoint=True, terminate=terminate))


@pytest.mark.parametrize("terminate", [True, False])
def test_metadata_records_whether_a_savepoint_ended_its_job(terminate: bool) -> None:
    """A stop-with-savepoint committed its output before the job ended; a savepoint of a
    job that kept running committed nothing (Flink's `CheckpointProperties.terminate`).
    The file says which, and the reader gets it back."""
    raw = metadata.encode(_savepoint(terminate))
    assert json.loads(raw)["body"]["properties"]["terminate"] is terminate
    assert metadata.decode(raw).properties.terminate is terminate


def test_metadata_written_without_terminate_reads_as_a_savepoint_that_did_not_end_its_job() -> None:
    """Files written before the field existed still load, with one documented default."""
    import hashlib

    doc = json.loads(metadata.encode(_savepoint(True)))
    del doc["body"]["properties"]["terminate"]
    doc["checksum"]["value"] = hashlib.sha256(metadata.canonical_json(doc["body"])).hexdigest()
    data = metadata.decode(json.dumps(doc).encode())
    assert data.properties.savepoint and data.properties.terminate is False
