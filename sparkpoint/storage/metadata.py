"""The `_metadata` file format (documented in docs/checkpoint-format.md).

    {"format": "sparkpoint-checkpoint", "version": 1,
     "checksum": {"algorithm": "sha256", "value": "<hex of the canonical body>"},
     "body": {"job_name": ..., "checkpoint_id": ..., "trigger_timestamp_ms": ...,
              "completion_timestamp_ms": ..., "properties": {...}, "handles": {...}}}

`properties.terminate` (a savepoint that ended its job, so its completion committed the
output; Flink's `CheckpointProperties.terminate`) is absent in files written before it
was recorded; it then reads as false. Older readers ignore it: no version change.

The checksum covers the canonical encoding of `body` (sorted keys, no whitespace,
UTF-8), so a reader detects a torn or edited file without trusting the writer's
formatting. Nothing here is ever unpickled: the file is plain JSON.

`read_completed` is the one place that reads a `_metadata` file from storage: restore
(`FsCheckpointStorage.load_completed`), discard, gc, `checkpoints list|verify` and
`doctor` all go through it, so every reader checks the same things (docs steps 1-6).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Mapping

from sparkpoint.checkpoint.interfaces import CheckpointProperties, CompletedCheckpointData
from sparkpoint.errors import CorruptCheckpointError, ForeignCheckpointError, MetadataEncodeError

if TYPE_CHECKING:
    from sparkpoint.storage.fs import StorageFS
    from sparkpoint.storage.layout import JobLayout

FORMAT_NAME = "sparkpoint-checkpoint"
FORMAT_VERSION = 1
CHECKSUM_ALGORITHM = "sha256"


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _checksum(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(body)).hexdigest()


def encode(data: CompletedCheckpointData) -> bytes:
    """Serialize a completed checkpoint. Raises MetadataEncodeError if a handle is not
    JSON-compatible (the participant is named)."""
    for participant, handle in data.handles.items():
        try:
            canonical_json(handle)
        except (TypeError, ValueError) as e:
            raise MetadataEncodeError(
                f"checkpoint {data.checkpoint_id}: the state handle of participant {participant!r} "
                f"is not JSON-compatible ({e}); it must contain only dicts, lists, str, int, "
                f"finite float, bool and None") from e
    body = {
        "job_name": data.job_name,
        "checkpoint_id": int(data.checkpoint_id),
        "trigger_timestamp_ms": int(data.trigger_timestamp_ms),
        "completion_timestamp_ms": int(data.completion_timestamp_ms),
        "properties": {"forced": bool(data.properties.forced),
                       "periodic": bool(data.properties.periodic),
                       "savepoint": bool(data.properties.savepoint),
                       "terminate": bool(data.properties.terminate)},
        "handles": {str(k): v for k, v in data.handles.items()},
    }
    # Round-trip through JSON once so tuples/Mapping subclasses become what a reader
    # will see; the checksum is then over exactly what decode() recomputes.
    body = json.loads(canonical_json(body))
    document = {
        "format": FORMAT_NAME,  # first, so even a truncated file shows whose it is
        "version": FORMAT_VERSION,
        "checksum": {"algorithm": CHECKSUM_ALGORITHM, "value": _checksum(body)},
        "body": body,
    }
    return (json.dumps(document, ensure_ascii=False, allow_nan=False, indent=1) + "\n").encode("utf-8")


def decode(raw: bytes, expected_job: str | None = None, source: str = "checkpoint metadata"
           ) -> CompletedCheckpointData:
    """Parse and verify `_metadata`. `source` (usually the path) is named in errors.

    Raises CorruptCheckpointError: empty, truncated, not JSON, checksum mismatch, fields
    missing or of the wrong type. Raises ForeignCheckpointError: not a sparkpoint
    checkpoint, a format version newer than this reader, or another job's checkpoint.
    """
    if not raw:
        raise CorruptCheckpointError(f"{source} is empty (the write was cut short); "
                                     f"this checkpoint cannot be restored from")
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        hint = ("truncated or damaged" if FORMAT_NAME.encode() in raw[:200]
                else "not JSON; it may have been written by another program")
        raise CorruptCheckpointError(f"{source} is {hint} ({e}); this checkpoint cannot be "
                                     f"restored from") from e
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise ForeignCheckpointError(
            f"{source} is not a sparkpoint checkpoint (format {found!r}, expected "
            f"{FORMAT_NAME!r}); point the checkpoint directory somewhere sparkpoint owns")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptCheckpointError(f"{source} has an invalid format version {version!r}")
    if version > FORMAT_VERSION:
        raise ForeignCheckpointError(
            f"{source} uses checkpoint format version {version}, but this sparkpoint reads "
            f"versions up to {FORMAT_VERSION}; upgrade sparkpoint to restore from it")
    body = document.get("body")
    checksum = document.get("checksum")
    if not isinstance(body, dict) or not isinstance(checksum, dict):
        raise CorruptCheckpointError(f"{source} lacks its body or checksum")
    if checksum.get("algorithm") != CHECKSUM_ALGORITHM:
        raise CorruptCheckpointError(
            f"{source} names checksum algorithm {checksum.get('algorithm')!r}; "
            f"version {FORMAT_VERSION} uses {CHECKSUM_ALGORITHM!r}")
    if checksum.get("value") != _checksum(body):
        raise CorruptCheckpointError(f"{source} fails its checksum (the file was damaged or "
                                     f"edited); this checkpoint cannot be restored from")
    data = _body_to_data(body, source)
    if expected_job is not None and data.job_name != expected_job:
        raise ForeignCheckpointError(
            f"{source} belongs to job {data.job_name!r}, not {expected_job!r}; it was copied "
            f"or the job directory is shared by mistake; remove it or use its own job name")
    return data


def read_completed(fs: "StorageFS", layout: "JobLayout", checkpoint_id: int
                   ) -> CompletedCheckpointData | None:
    """Read and verify `chk-<checkpoint_id>/_metadata` of the job at `layout`.

    Returns None if the checkpoint has no `_metadata` (it never completed, or it was
    discarded between listing and reading). Raises CorruptCheckpointError or
    ForeignCheckpointError (see `decode`) if the file is unreadable, another job's, or
    records another checkpoint id than its directory's (it was copied or moved: it is
    never restored from). StorageError on I/O failure. Each caller decides what an error
    means for it: restore skips the checkpoint, gc keeps every shared file, inspection
    reports it."""
    path = layout.metadata(checkpoint_id)
    if not fs.exists(path):
        return None
    try:
        raw = fs.read_bytes(path)
    except FileNotFoundError:
        return None  # discarded between listing and reading
    data = decode(raw, layout.job_name, path)
    if data.checkpoint_id != checkpoint_id:
        raise CorruptCheckpointError(
            f"{path} records checkpoint {data.checkpoint_id}, not {checkpoint_id}: it was copied "
            f"or moved by hand; this checkpoint is never restored from")
    return data


def _body_to_data(body: Mapping[str, Any], source: str) -> CompletedCheckpointData:
    try:
        props = body.get("properties") or {}
        handles = body["handles"]
        if not isinstance(handles, dict):
            raise TypeError("handles is not an object")
        job_name = body["job_name"]
        if not isinstance(job_name, str):
            raise TypeError("job_name is not a string")
        return CompletedCheckpointData(
            job_name=job_name,
            checkpoint_id=_int(body["checkpoint_id"]),
            trigger_timestamp_ms=_int(body["trigger_timestamp_ms"]),
            completion_timestamp_ms=_int(body["completion_timestamp_ms"]),
            handles=handles,
            properties=CheckpointProperties(forced=bool(props.get("forced", False)),
                                            periodic=bool(props.get("periodic", True)),
                                            savepoint=bool(props.get("savepoint", False)),
                                            # Absent in files written before it was recorded:
                                            # read as a savepoint that did not end its job.
                                            terminate=bool(props.get("terminate", False))),
        )
    except (KeyError, TypeError, AttributeError) as e:
        raise CorruptCheckpointError(f"{source} passes its checksum but a field is missing or "
                                     f"of the wrong type: {e}") from e


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value
