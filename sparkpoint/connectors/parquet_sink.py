"""Exactly-once Parquet files, committed with the checkpoint that covers them.

Layout under `path`:

    _staging/epoch=<e>/part-0.parquet    staged; ignored by Spark and pyarrow readers
    epoch=<e>/part-0.parquet             committed output (read the whole dir with
                                         spark.read.parquet(path): `epoch` is a column)

Commit protocol (each step idempotent; what a crash at each step leaves):
  1. write_epoch(e): write `_staging/epoch=<e>/part-0.parquet` via a temp file + rename.
     Crash: the staged epoch is discarded on restore and re-run.
  2. pre_commit(cid) at the barrier: the handle lists every staged, uncommitted epoch
     up to now (including those of failed checkpoints: their rows are in the state the
     next checkpoint captures). Crash: as 1.
  3. `_metadata` of cid is written by the coordinator. Crash after it: on restore,
     recover(handle) runs step 4 for cid.
  4. commit(handle): rename each `_staging/epoch=<e>` to `epoch=<e>` (atomic on
     local disk and NFS); an epoch already renamed is skipped.
  5. recover(handle) also deletes every other staged epoch (they belong to epochs
     after the restored checkpoint and will be re-run), and any committed epoch after
     the restored checkpoint's last epoch (only possible when restore fell back to an
     older checkpoint because a newer one was corrupt), so the output stays exactly-once.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import uuid
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from sparkpoint.connectors.base import Sink

log = logging.getLogger(__name__)
_EPOCH_DIR = re.compile(r"^epoch=(\d+)$")
STAGING = "_staging"


class ParquetSink(Sink):
    def __init__(self, path: str, name: str = "parquet"):
        self.path = os.path.abspath(path)
        self.name = name
        self._lock = threading.Lock()
        self._staged: set[int] = set()
        self._last_epoch = -1

    @property
    def staging(self) -> str:
        return os.path.join(self.path, STAGING)

    def _epoch_name(self, epoch: int) -> str:
        return f"epoch={epoch:08d}"

    def open(self, job_name: str) -> None:
        os.makedirs(self.staging, exist_ok=True)

    def committed_epochs(self) -> list[int]:
        if not os.path.isdir(self.path):
            return []
        return sorted(int(m.group(1)) for n in os.listdir(self.path) if (m := _EPOCH_DIR.match(n)))

    def recover(self, handle: Mapping[str, Any] | None) -> None:
        if handle:
            self.commit(handle)
        last = int(handle.get("last_epoch", -1)) if handle else -1
        for epoch in self.committed_epochs():
            if epoch > last:
                log.warning("sink %s: removing committed epoch %d: it lies after the restored checkpoint "
                            "(epoch %d), which happens only when restore fell back past a corrupt checkpoint; "
                            "it will be produced again", self.name, epoch, last)
                shutil.rmtree(os.path.join(self.path, self._epoch_name(epoch)), ignore_errors=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        os.makedirs(self.staging, exist_ok=True)
        with self._lock:
            self._staged.clear()
            self._last_epoch = last

    def write_epoch(self, epoch: int, rows: pa.Table) -> None:
        with self._lock:
            self._last_epoch = max(self._last_epoch, epoch)
        if rows.num_rows == 0:
            return
        target_dir = os.path.join(self.staging, self._epoch_name(epoch))
        os.makedirs(target_dir, exist_ok=True)
        tmp = os.path.join(target_dir, f".part-0.{uuid.uuid4().hex}.tmp")
        pq.write_table(rows, tmp)
        os.replace(tmp, os.path.join(target_dir, "part-0.parquet"))
        with self._lock:
            self._staged.add(epoch)

    def pre_commit(self, checkpoint_id: int) -> Mapping[str, Any]:
        with self._lock:
            return {"epochs": sorted(self._staged), "last_epoch": self._last_epoch, "path": self.path}

    def commit(self, handle: Mapping[str, Any]) -> None:
        for epoch in handle.get("epochs", []):
            name = self._epoch_name(int(epoch))
            src, dst = os.path.join(self.staging, name), os.path.join(self.path, name)
            if os.path.exists(dst):
                pass  # committed before (a retried commit, or recovery re-running it)
            elif os.path.exists(src):
                os.rename(src, dst)
            else:
                log.error("sink %s: staged epoch %s is missing and was never committed; its rows are lost. "
                          "Was the output directory modified by hand?", self.name, epoch)
                continue
            with self._lock:
                self._staged.discard(int(epoch))
