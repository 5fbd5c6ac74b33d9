"""Epochs replayed as first planned after a restore (part of the driver).

A sink that cannot withdraw what it published (a committed Kafka transaction) may have
published epochs past the checkpoint a restore falls back to, when the newer
checkpoints are damaged or lost. Those epochs run again from the restored state, and
their state effects must be applied, but their output must be the output already
published: so they run with the plan each had when it first ran (every source's slice,
the watermark, the processing time, whether it was the final epoch), read back from the
epoch plan log (storage/epoch_plans.py), and the sink skips publishing them.

The sequence:
  1. before an epoch runs, its plan is written to the log (`record`), once per epoch;
     a write that fails is retried before the next barrier, and the sink's part of a
     checkpoint is declined while an epoch it would publish is not in the log
     (`unlogged`), so no output is ever published without its plan;
  2. on restore, the sink says up to which epoch it has published (`Sink.published_epoch`);
     epochs after the restored one up to it are read from the log (`prepare`): all of
     them, checked, before anything runs, or none (PublishedEpochsNotReplayableError);
  3. the epoch loop runs those epochs from their entries (`replay`);
  4. once a checkpoint completes, entries no retained checkpoint can need are deleted.

What is replayed identically: the sources' slices (the same records, as sources are
replayable), the watermark, the processing time handed to timers, the final flag, and so
the state and output of the built-in steps and of processors that take time from their
context. What is not: user code reading the wall clock itself (time.time(),
current_timestamp() in a transform) or calling anything else non-deterministic; its
output after a fall-back can differ from what was published.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any, Mapping

from sparkpoint.connectors.base import SlicePlan
from sparkpoint.errors import EpochPlanError, PublishedEpochsNotReplayableError, StorageError
from sparkpoint.runtime.failures import summarize as _summary
from sparkpoint.storage.epoch_plans import EpochPlan, EpochPlanLog

log = logging.getLogger("sparkpoint.runtime.jobmaster")


def new_history() -> str:
    return uuid.uuid4().hex[:12]


class EpochReplay:
    """The job's epoch plan log as the epoch loop uses it. `log` None: the sink withdraws
    what a restore leaves behind (Parquet, Delta), so nothing is logged or replayed."""

    def __init__(self, plan_log: EpochPlanLog | None):
        self.log = plan_log
        self.history = new_history()
        self._unlogged: list[EpochPlan] = []  # written to the log when storage takes them
        self._replays: dict[int, EpochPlan] = {}
        self._logged: set[int] = set()  # entries this run knows of, for deletion
        self._lock = threading.Lock()  # _logged: the committer thread deletes

    @property
    def enabled(self) -> bool:
        return self.log is not None

    # -- 1. each epoch ------------------------------------------------------------------
    def record(self, epoch: int, plan: SlicePlan, final: bool, watermark: int | None,
               processing_time_ms: int) -> None:
        if self.log is None:
            return
        self._unlogged.append(EpochPlan(epoch, self.history, dict(plan.start), dict(plan.end), final,
                                        watermark, processing_time_ms))
        self.flush()

    def flush(self) -> str | None:
        """Write the entries storage refused so far. None when all are in the log, else why not."""
        while self._unlogged:
            entry = self._unlogged[0]
            try:
                self.log.write(entry)
            except StorageError as e:
                return (f"the plan of epoch {entry.epoch} is not in the epoch plan log yet ({_summary(e)}); "
                        f"the sink publishes nothing until it is")
            self._unlogged.pop(0)
            with self._lock:
                self._logged.add(entry.epoch)
        return None

    # -- 2. restore -----------------------------------------------------------------------
    def begin(self, history: str | None) -> None:
        """A restore or a fresh start: `history` is the restored checkpoint's line of
        epochs (None: a new one begins, at a fresh start or a savepoint)."""
        self.history = history or new_history()
        self._unlogged = []
        self._replays = {}

    def prepare(self, restored_epoch: int, published_epoch: int | None, positions: Mapping[str, Any],
                restored: str, sink: str, publish_again: bool) -> None:
        """Read the entries of the epochs after `restored_epoch` up to `published_epoch`,
        which the sink has published and cannot withdraw. PublishedEpochsNotReplayableError
        (nothing started) when one cannot be replayed, unless `publish_again`."""
        if published_epoch is None or published_epoch <= restored_epoch:
            return
        epochs = range(restored_epoch + 1, published_epoch + 1)
        try:
            if self.log is None:
                raise EpochPlanError("this job keeps no epoch plan log")
            found = {e: self.log.read(e) for e in epochs}
            for e, entry in found.items():
                if entry.history != self.history:
                    raise EpochPlanError(f"{self.log.path(e)} belongs to another line of epochs (history "
                                         f"{entry.history}, not {self.history}): a fresh start or a savepoint "
                                         f"restored since wrote it")
            first = found[restored_epoch + 1]
            moved = {s: (p, first.start.get(s)) for s, p in positions.items() if first.start.get(s) != p}
            if moved:
                raise EpochPlanError(f"{self.log.path(first.epoch)} starts elsewhere than {restored} ended "
                                     f"(split: (restored, logged) {moved})")
        except (EpochPlanError, StorageError) as e:
            what = (f"{sink} already published epochs {epochs.start}..{epochs.stop - 1}, after {restored} "
                    f"(epoch {restored_epoch}), and the epoch plan log cannot replay them as first planned: "
                    f"{_summary(e)}")
            if publish_again:
                log.warning("%s. restore.unreplayable-epochs=publish-again: they are planned anew and published "
                            "a second time", what)
                return
            raise PublishedEpochsNotReplayableError(
                f"{what}. Restoring would publish them a second time, so nothing was started. Restore a newer "
                f"checkpoint if one verifies (`sparkpoint doctor`), or accept the duplicates with --set "
                f"restore.unreplayable-epochs=publish-again") from None
        self._replays = found
        with self._lock:
            self._logged.update(found)
        log.info("%s already published epochs %d..%d: they run again as first planned (state applied, output "
                 "not published again)", sink, epochs.start, epochs.stop - 1)

    # -- 3. the epoch loop ------------------------------------------------------------------
    def replay(self, epoch: int) -> EpochPlan | None:
        """The logged plan `epoch` must run with, or None: plan it anew."""
        return self._replays.get(epoch)

    # -- 4. after a checkpoint completed (committer thread) ------------------------------------
    def forget_through(self, epoch: int) -> None:
        """Delete the entries at or below `epoch` (the oldest retained checkpoint's): no
        restore reads them again. Best effort: the start-up garbage collector removes the rest."""
        if self.log is None:
            return
        with self._lock:
            doomed = sorted(e for e in self._logged if e <= epoch)
        try:
            for e in doomed:
                self.log.fs.rm(self.log.path(e))
                with self._lock:
                    self._logged.discard(e)
        except Exception as e:  # noqa: BLE001 - only garbage
            log.warning("could not delete epoch plans up to epoch %d (%s); the next start-up garbage collection "
                        "removes them", epoch, _summary(e))
