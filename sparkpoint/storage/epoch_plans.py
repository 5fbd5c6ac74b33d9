"""The epoch plan log: what each epoch read and ran with, written before its output can
be published (documented in docs/checkpoint-format.md).

    <root>/<job>/plans/epoch-<epoch:020d>.json
    {"format": "sparkpoint-epoch-plan", "version": 1,
     "checksum": {"algorithm": "sha256", "value": "<hex of the canonical body>"},
     "body": {"epoch": 7, "history": "<hex>", "start": {split: position}, "end": {...},
              "final": false, "watermark": 1700000000000, "processing_time_ms": 1700000001234}}

Why: a sink whose published output cannot be withdrawn (a committed Kafka transaction)
may have published epochs past the checkpoint a restore falls back to (the newer one is
damaged). Those epochs run again from the restored state, and they must be the same
epochs: the same slice of every source, the same watermark, the same processing time,
or their output differs from what was published. Spark Structured Streaming keeps its
offset log for the same reason.

`history` names one line of epochs: it begins at a fresh start or a savepoint restore
and goes on through every failover of the job to its own checkpoints. An entry of
another history is never replayed. Epoch numbers repeat across failovers, so an entry
is overwritten when its epoch is planned again, which only happens to epochs whose
output was not published. Entries at or below the epoch of the oldest retained
checkpoint are never read again and are deleted with the checkpoints.

Nothing here is unpickled: the entry is plain JSON with a checksum over its body.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from sparkpoint.errors import EpochPlanError
from sparkpoint.storage.metadata import canonical_json

if TYPE_CHECKING:
    from sparkpoint.storage.fs import StorageFS
    from sparkpoint.storage.layout import JobLayout

FORMAT_NAME = "sparkpoint-epoch-plan"
FORMAT_VERSION = 1
PLANS_DIR = "plans"
_ENTRY_RE = re.compile(r"^epoch-(\d{20})\.json$")


def entry_name(epoch: int) -> str:
    return f"epoch-{epoch:020d}.json"  # zero-padded: names sort in epoch order on every backend


def parse_entry_name(name: str) -> int | None:
    m = _ENTRY_RE.match(name.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class EpochPlan:
    """Everything an epoch's output depends on besides the state it starts from."""

    epoch: int
    history: str
    start: Mapping[str, Any]  # split -> position, as the sources plan them
    end: Mapping[str, Any]
    final: bool  # the end-of-input epoch that fires every timer and window
    watermark: int | None  # the event-time watermark the epoch ran with
    processing_time_ms: int  # "now" for the epoch's processing-time timers

    def body(self) -> dict[str, Any]:
        return {"epoch": int(self.epoch), "history": self.history, "start": dict(self.start),
                "end": dict(self.end), "final": bool(self.final), "watermark": self.watermark,
                "processing_time_ms": int(self.processing_time_ms)}

    def encode(self) -> bytes:
        body = self.body()
        return canonical_json({"format": FORMAT_NAME, "version": FORMAT_VERSION,
                               "checksum": {"algorithm": "sha256",
                                            "value": hashlib.sha256(canonical_json(body)).hexdigest()},
                               "body": body})

    @classmethod
    def decode(cls, raw: bytes, source: str) -> "EpochPlan":
        """EpochPlanError if `raw` is not an intact entry."""
        try:
            doc = json.loads(raw)
            body = doc["body"]
            ok = (doc.get("format") == FORMAT_NAME and doc.get("version") == FORMAT_VERSION
                  and doc["checksum"]["value"] == hashlib.sha256(canonical_json(body)).hexdigest())
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as e:
            raise EpochPlanError(f"{source} is not an epoch plan ({type(e).__name__}: {e})") from None
        if not ok:
            raise EpochPlanError(f"{source} fails its checksum or has an unknown format or version")
        try:
            plan = cls(_int(body["epoch"]), str(body["history"]), dict(body["start"]), dict(body["end"]),
                       bool(body["final"]), None if body["watermark"] is None else _int(body["watermark"]),
                       _int(body["processing_time_ms"]))
        except (KeyError, TypeError, ValueError) as e:
            raise EpochPlanError(f"{source} passes its checksum but a field is missing or of the wrong "
                                 f"type: {e}") from None
        return plan


class EpochPlanLog:
    """The plan log of one job in checkpoint storage."""

    def __init__(self, fs: "StorageFS", layout: "JobLayout"):
        self.fs = fs
        self.layout = layout

    @property
    def directory(self) -> str:
        return self.layout.join(PLANS_DIR)

    def path(self, epoch: int) -> str:
        return self.layout.join(PLANS_DIR, entry_name(epoch))

    def write(self, plan: EpochPlan) -> None:
        """One small atomic write. StorageError on I/O failure."""
        self.fs.write_atomic(self.path(plan.epoch), plan.encode())

    def read(self, epoch: int) -> EpochPlan:
        """The entry of `epoch`. EpochPlanError if it is missing or damaged; StorageError
        on I/O failure."""
        path = self.path(epoch)
        try:
            raw = self.fs.read_bytes(path)
        except FileNotFoundError:
            raise EpochPlanError(f"{path} is missing") from None
        plan = EpochPlan.decode(raw, path)
        if plan.epoch != epoch:
            raise EpochPlanError(f"{path} records epoch {plan.epoch}, not {epoch}: it was copied or moved")
        return plan

    def epochs(self) -> list[int]:
        """The epochs with an entry, ascending."""
        return sorted(e for e in map(parse_entry_name, self.fs.ls(self.directory)) if e is not None)



def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value
