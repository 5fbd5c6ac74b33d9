"""Which store a subtask's task works on: one decision, from what the local store says
about itself, the lineage the driver sent, and what the driver planned for the epoch.

    how       when (the condition that proves it)
    --------  ---------------------------------------------------------------------
    fresh     the lineage is empty (no state yet) and no local store qualifies below
    rebuild   local disk is not trusted (a restore rebuilds from verified files), or
              there is no local store, or it was written in another generation, or it
              is not on the lineage (ahead of it: a failed attempt's epoch)
    retry     the store committed this very epoch on the lineage's tip, in this
              generation, over the same slice: Spark ran the task again; its stored
              output is returned and no row is applied twice
    local     the store is at the lineage's tip, written in this generation
    catch-up  the store is behind on the lineage, written in this generation: the
              change logs after it are replayed

A *generation* begins at every restore and every fresh start of the job (the driver's
`Lineages` mints it). The stores a restore builds itself, from verified files (the
rebuild of `RestoreTask`, the re-cut of `RescaleTask`), carry its generation, so the
first epoch after it finds them `local`. After a failover the driver plans the same epoch numbers again
over other slices (Kafka reads up to its new end, a rate-limited source has more, the
epoch sizer keeps its budget), so epoch number and parent state prove nothing across
generations: a store of an earlier generation is never used, and a retry must match
the generation and the slice. Within one generation the driver plans each epoch once.

Pure: no RocksDB, no files (tests/unit/runtime/test_store_opening.py covers each row).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from sparkpoint.state.changelog import NO_EPOCH, Lineage


class How(str, Enum):
    FRESH = "fresh"
    REBUILD = "rebuild"
    RETRY = "retry"
    LOCAL = "local"
    CATCH_UP = "catch-up"


@dataclass(frozen=True)
class EpochInput:
    """What the driver planned for one epoch: two runs of an epoch with equal inputs
    read the same rows."""

    generation: str
    slice: str  # slice_identity() of the epoch's plan; "" where no epoch is planned (a restore)


def slice_identity(start: Mapping[str, Any], end: Mapping[str, Any]) -> str:
    """A short fingerprint of a planned slice: every split's [start, end) positions."""
    raw = json.dumps([start, end], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LocalStore:
    """What a local store says about itself: its last committed epoch and the record
    committed with it (`SubtaskState.commit`, or a relabel after a verified rebuild)."""

    epoch: int
    ref: str | None
    parent: str | None = None
    generation: str | None = None
    slice: str | None = None

    @classmethod
    def of(cls, epoch: int, record: Mapping[str, Any]) -> "LocalStore":
        # A store that never committed holds the empty state.
        ref = record.get("ref", "empty" if epoch == NO_EPOCH else None)
        return cls(epoch, ref, record.get("parent"), record.get("generation"), record.get("slice"))


@dataclass(frozen=True)
class Decision:
    how: How
    why: str  # the condition that proved it, for the task's report


def decide(lineage: Lineage, epoch: int, given: EpochInput | None, local: LocalStore | None,
           trust_local: bool = True) -> Decision:
    """How the task for `epoch` (whose state is `lineage`'s tip) gets its store.
    `given` None: nothing proves a local store (a tool reading state); `local` None:
    there is no usable local store."""
    lin = lineage

    def start_over(why: str) -> Decision:
        empty = lin.epoch == NO_EPOCH and lin.base is None
        return Decision(How.FRESH if empty else How.REBUILD, why)

    if not trust_local:
        return start_over("local disk is not trusted here: rebuilt from files verified against the checkpoint")
    if given is None:
        return start_over("the task carries no generation, so no local store can be proven")
    if local is None:
        return start_over("no usable local store")
    if local.generation != given.generation:
        return start_over(f"the local store was written in generation {local.generation}, the job is in "
                          f"{given.generation} (restored or started fresh since)")
    if local.epoch == epoch and local.parent == lin.tip_ref:
        if given.slice and local.slice == given.slice:
            return Decision(How.RETRY, f"the store committed epoch {epoch} on the lineage's tip in this generation "
                                       f"over the same slice {given.slice}")
        return start_over(f"the store committed epoch {epoch} over slice {local.slice}, this task's slice is "
                          f"{given.slice}")
    if local.epoch == lin.epoch and local.ref == lin.tip_ref:
        return Decision(How.LOCAL, f"the store is at the lineage's tip (epoch {lin.epoch})")
    if local.epoch < lin.epoch and local.ref is not None and local.ref == lin.ref_at(local.epoch):
        return Decision(How.CATCH_UP, f"the store is at epoch {local.epoch} of the lineage, which is at "
                                      f"{lin.epoch}")
    return start_over(f"the local store (epoch {local.epoch}) is not on the lineage (epoch {lin.epoch})")
