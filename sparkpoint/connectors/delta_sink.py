"""Exactly-once into a Delta Lake table, committed with the checkpoint that covers it, on a
local path or an object store (`s3://bucket/prefix`). Written with delta-rs (the
`deltalake` package) on the driver; executors need pyarrow only.

Layout under `path` (the table root; docs/output.md has the full story):

    _delta_log/<version>.json                     the Delta log (delta-rs writes it)
    epoch-<e>/part-<task>-<uuid>.parquet          data files, written by executor tasks;
                                                  in the table once an `add` names them

A reader (`deltalake.DeltaTable(path)`, Spark's `format("delta")`, Trino, DuckDB, ...)
sees exactly the files the log's active `add` actions name, so a data file written
but not committed is invisible without being moved anywhere.

Every commit is one Delta transaction that carries the application transaction
`txn(appId = job name, version = checkpoint id)`. Checkpoint ids only grow (storage/ids.py),
so `DeltaTable.transaction_version(app_id) >= cid` means "checkpoint cid, or a later one,
is committed": a retried commit is skipped by the table's own record, the mechanism Delta
gives idempotent streaming writers (Spark's Delta sink skips a batch the same way).

Commit protocol (each step idempotent; what a crash at each step leaves):
  1. executor: `DeltaEpochWriter.write(e, part, rows)` writes one Parquet file per task
     attempt at `epoch-<e>/part-<task>-<uuid>.parquet`, durably (fsync / one PUT), and
     returns a handle {epoch, part, path, size, sha256, rows, schema}. Crash: the file is
     an orphan no `add` names; recovery deletes it.
  2. driver: `stage_epoch(e, handles)` remembers the winning tasks' handles (no I/O).
  3. `pre_commit(cid)`: the checkpoint's handle lists every staged, uncommitted file up
     to the barrier (files of failed checkpoints included) and `last_epoch`. Crash: as 1.
  4. `_metadata` of cid is written by the coordinator. Crash after it: `recover(handle)`
     runs step 5 for cid.
  5. `commit(handle)`: if the table records txn version >= cid for the app id, nothing
     to do. Otherwise the files no active `add` names yet are checked (present, size; on
     recovery on local disk also sha256) and added in ONE transaction with txn(app, cid)
     (the first commit creates the table with the files' schema). Crash before the log
     entry: nothing visible; re-run adds them. Crash after: the re-run is skipped by txn.
     Then files of the committed epochs that no `add` names (losing task attempts) are
     deleted, best effort.
  6. `recover(handle)`: re-runs 5 for the restored checkpoint, then withdraws active
     files of epochs after its `last_epoch` (only when a restore fell back past a newer,
     corrupt checkpoint whose output was committed) and lowers the txn version to cid in
     that same transaction, so the checkpoints that produce those epochs again commit;
     then deletes every data file of this layout that no active `add` names.
     `recover(None)` (a fresh start) withdraws everything of this layout and records txn 0.

Merge by key (`merge_keys`): steps 1-4 are the same (each task writes its last row per
key). Step 5 reads the handle's files of epochs the table does not hold yet, in epoch,
task, row order, keeps the last row per key (delta_merge.py) and merges them with ONE
`MERGE` (or, first, the table's creation) that carries txn(app, cid) and
txn(app + "/next-epoch", last_epoch + 1). The second record is what lets a handle that
names epochs an earlier commit merged skip them: merging an epoch again would put an
older row back over a newer one. The merged staged files are deleted afterwards. Merged
rows cannot be withdrawn file by file, so `recover` first rewinds a table that holds
epochs after the restored checkpoint: Delta RESTORE to its latest version that holds
none (or emptied), recording both txn versions in that commit, then merges the handle.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sparkpoint.connectors.base import EpochWriter, Sink
from sparkpoint.connectors.delta_merge import check_merge_keys, last_per_key, merge_predicate
from sparkpoint.connectors.parquet_sink import resolve_output_url
from sparkpoint.errors import ConfigError, CorruptCheckpointError, StorageError
from sparkpoint.storage.fs import StorageFS, fsync_dir

log = logging.getLogger(__name__)

HANDLE_VERSION = 1
_DATA_FILE = re.compile(r"^epoch-(\d{8,})/part-(\d{5,})-([0-9a-f]{32})\.parquet$")
_HEX = re.compile(r"^[0-9a-f]+$")
# s3fs storage options that only tune fsspec itself: nothing to translate for delta-rs.
_FSSPEC_ONLY = {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths", "asynchronous",
                "loop", "default_block_size", "default_fill_cache", "default_cache_type", "version_aware",
                "cache_regions", "config_kwargs", "s3_additional_kwargs", "requester_pays", "use_ssl"}


def epoch_dir(epoch: int) -> str:
    return f"epoch-{epoch:08d}"


def _deltalake():
    try:
        import deltalake
        import deltalake.transaction  # noqa: F401  (AddAction, CommitProperties, Transaction)
    except ImportError as e:
        raise ConfigError("DeltaSink needs the deltalake package on the driver: pip install 'sparkpoint[delta]' "
                          f"(or deltalake itself): {e}") from e
    return deltalake


def schema_fingerprint(schema: pa.Schema) -> str:
    """Same columns and types, same fingerprint (field metadata, e.g. pandas', ignored)."""
    text = ";".join(f"{f.name}:{f.type}:{f.nullable}" for f in schema)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _for_delta(rows: pa.Table) -> pa.Table:
    """Delta stores timestamps in microseconds: a column in ns/ms/s is cast (sub-microsecond
    digits are dropped; Spark's own timestamps are microseconds already)."""
    for i, f in enumerate(rows.schema):
        if pa.types.is_timestamp(f.type) and f.type.unit != "us":
            target = pa.timestamp("us", f.type.tz)
            rows = rows.set_column(i, pa.field(f.name, target, f.nullable, f.metadata),
                                   pc.cast(rows.column(i), target, safe=False))
    return rows


@dataclass(frozen=True)
class DeltaEpochWriter(EpochWriter):
    """Runs on executors: writes one task's rows of one epoch as one Parquet data file in
    the table directory, under a name unique to the attempt, durable before `write`
    returns. Invisible to readers until the driver's commit adds it to the log. With
    `merge_keys`, only the task's last row per key is written (the others would be
    replaced in the same commit anyway)."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    compression: str = "snappy"
    merge_keys: tuple[str, ...] = ()
    sink: str = "delta"

    def write(self, epoch: int, part: int, rows: pa.Table) -> list[dict[str, Any]]:
        if self.merge_keys:
            rows = last_per_key(self.sink, rows, self.merge_keys)
        if rows.num_rows == 0:
            return []
        rows = _for_delta(rows)
        sink = pa.BufferOutputStream()
        pq.write_table(rows, sink, compression=self.compression)
        data = sink.getvalue()
        relative = f"{epoch_dir(epoch)}/part-{part:05d}-{uuid.uuid4().hex}.parquet"
        storage = StorageFS.from_url(self.url, storage_options=dict(self.storage_options))
        target = f"{storage.root}/{relative}"
        if storage.is_local:
            directory = os.path.dirname(target)
            os.makedirs(directory, exist_ok=True)
            with open(target, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(directory)
            fsync_dir(os.path.dirname(directory))
        else:
            storage.fs.pipe_file(target, data.to_pybytes())  # one PUT: durable once acknowledged
        return [{"epoch": int(epoch), "part": int(part), "path": relative, "size": data.size,
                 "sha256": hashlib.sha256(data).hexdigest(), "rows": rows.num_rows,
                 "schema": schema_fingerprint(rows.schema)}]


def translate_storage_options(protocol: str, storage_options: Mapping[str, Any]) -> dict[str, str]:
    """delta-rs (object_store) options equivalent to s3fs `storage_options`, so one set of
    options serves the executors' writes and the driver's commits. Raises ConfigError for
    an option it cannot translate (pass `delta_storage_options` then)."""
    if protocol in ("file", "local") or not storage_options:
        return {}
    if protocol not in ("s3", "s3a"):
        raise ConfigError(f"DeltaSink cannot translate storage_options for {protocol}://; pass "
                          f"delta_storage_options (delta-rs/object_store keys) as well")
    out: dict[str, str] = {}
    untranslated = []
    client = dict(storage_options.get("client_kwargs") or {})
    for key, value in storage_options.items():
        if key == "key":
            out["AWS_ACCESS_KEY_ID"] = str(value)
        elif key == "secret":
            out["AWS_SECRET_ACCESS_KEY"] = str(value)
        elif key == "token":
            out["AWS_SESSION_TOKEN"] = str(value)
        elif key == "anon":
            if value:
                out["AWS_SKIP_SIGNATURE"] = "true"
        elif key == "endpoint_url":
            client.setdefault("endpoint_url", value)
        elif key == "client_kwargs":
            pass
        elif key not in _FSSPEC_ONLY:
            untranslated.append(key)
    for key, value in client.items():
        if key == "endpoint_url":
            out["AWS_ENDPOINT_URL"] = str(value)
            if str(value).startswith("http://"):
                out["AWS_ALLOW_HTTP"] = "true"
        elif key == "region_name":
            out["AWS_REGION"] = str(value)
        else:
            untranslated.append(f"client_kwargs.{key}")
    if untranslated:
        raise ConfigError(f"DeltaSink cannot translate storage_options {sorted(untranslated)} for delta-rs; pass "
                          f"delta_storage_options (delta-rs keys such as AWS_ENDPOINT_URL, AWS_REGION) as well")
    return out


class DeltaSink(Sink):
    """`path`: a local directory or `s3://bucket/prefix`, the Delta table's root (created
    on the first commit with the output's schema, or an existing table with the same
    columns). `storage_options`: s3fs options for the executors' data files; translated
    for delta-rs unless `delta_storage_options` is given. `app_id`: the Delta application
    transaction id (default: the job name). `merge_keys`: the output's key columns; each
    checkpoint's rows are then merged into the table by these columns (update a row with
    the same key, insert the others; the last row of a key wins), so the table holds one
    row per key. Without it every row is appended."""

    read_hint = "read it with deltalake.DeltaTable(...) or spark.read.format('delta'): committed versions only"

    def __init__(self, path: str | os.PathLike, name: str = "delta", storage_options: dict[str, Any] | None = None,
                 delta_storage_options: dict[str, str] | None = None, app_id: str | None = None,
                 compression: str = "snappy", merge_keys: Sequence[str] | None = None):
        self.path = resolve_output_url(path)
        self.name = name
        self.merge_keys = check_merge_keys(name, merge_keys)
        self.storage_options = dict(storage_options or {})
        self.compression = compression
        self._storage = StorageFS.from_url(self.path, storage_options=dict(self.storage_options))
        protocol = self._storage.fs.protocol
        self._protocol = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
        if self._protocol not in ("file", "local", "s3", "s3a"):
            raise ConfigError(f"sink {name}: a Delta table on {self._protocol}:// is not supported; use a local/NFS "
                              f"path or s3://bucket/prefix")
        self._delta_options = dict(delta_storage_options) if delta_storage_options is not None else \
            translate_storage_options(self._protocol, self.storage_options)
        if app_id is not None and (not isinstance(app_id, str) or not app_id):
            raise ConfigError(f"sink {name}: app_id must be a non-empty string, got {app_id!r}")
        self.app_id = app_id
        self._lock = threading.Lock()          # _staged, _last_epoch (epoch loop vs committer)
        self._commit_lock = threading.Lock()   # commit / recover
        self._staged: dict[str, dict[str, Any]] = {}
        self._last_epoch = -1
        self._schemas_ok: set[str] = set()     # fingerprints checked against the table's schema
        self._table: Any = None                # deltalake.DeltaTable, once the table exists

    @property
    def root(self) -> str:
        return self._storage.root

    @property
    def table_uri(self) -> str:
        """The table as delta-rs and other Delta readers name it."""
        return self.path

    def _abs(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def location(self) -> str | None:
        return self.path

    def open(self, job_name: str) -> None:
        _deltalake()
        if self.app_id is None:
            self.app_id = job_name
        if self._storage.is_local:
            self._storage.makedirs(self.root)

    def epoch_writer(self) -> DeltaEpochWriter:
        return DeltaEpochWriter(self.path, dict(self.storage_options), self.compression, self.merge_keys or (),
                                self.name)

    def _app(self) -> str:
        if not self.app_id:
            raise RuntimeError(f"sink {self.name}: open(job_name) was not called")
        return self.app_id

    # -- staging (driver: handles only) ------------------------------------------------
    def stage_epoch(self, epoch: int, handles: list[dict[str, Any]]) -> None:
        files = [_validate_file(h, f"epoch {epoch} task handle") for h in handles]
        for f in files:
            if f["epoch"] != epoch:
                raise ValueError(f"sink {self.name}: a handle of epoch {f['epoch']} was reported for epoch {epoch}")
        with self._lock:
            for f in files:
                self._staged[f["path"]] = f
            self._last_epoch = max(self._last_epoch, int(epoch))

    def write_epoch(self, epoch: int, rows: pa.Table) -> None:
        """Driver-side staging (the rows were collected): as one task with part 0."""
        self.stage_epoch(epoch, self.epoch_writer().write(epoch, 0, rows))

    def pre_commit(self, checkpoint_id: int) -> Mapping[str, Any]:
        with self._lock:
            files = sorted(self._staged.values(), key=lambda f: (f["epoch"], f["part"], f["path"]))
            return {"v": HANDLE_VERSION, "checkpoint": int(checkpoint_id), "last_epoch": self._last_epoch,
                    "files": [dict(f) for f in files]}

    # -- commit ------------------------------------------------------------------------
    def commit(self, handle: Mapping[str, Any]) -> None:
        files, last, cid = _validate_handle(handle)
        with self._commit_lock:
            if self.merge_keys:
                self._merge(files, cid, last, verify_sha256=False)
            else:
                self._commit(files, cid, last, verify_sha256=False)
            self._forget(files, last)

    def recover(self, handle: Mapping[str, Any] | None) -> None:
        """Re-run the restored checkpoint's commit, withdraw committed output of epochs
        after it, delete every data file no commit names. Raises CorruptCheckpointError
        (naming the file) if a file of the restored checkpoint is missing or corrupt."""
        with self._commit_lock:
            files, last, cid = [], -1, 0
            if handle:
                files, last, cid = _validate_handle(handle)
            self._check_mode()
            if self.merge_keys:
                # Rewind first: merged rows of later epochs cannot be taken out file by file.
                self._rewind_merged(last, cid)
                self._merge(files, cid, last, verify_sha256=self._storage.is_local)
            else:
                if handle:
                    self._commit(files, cid, last, verify_sha256=self._storage.is_local)
                self._withdraw_after(last, cid)
            self._delete_orphans()
        with self._lock:
            self._staged.clear()
            self._last_epoch = last

    def _load(self):
        """The table at its latest version, or None if there is none yet. The open table is
        kept and brought up to date incrementally: reopening replays the log since its last
        Delta checkpoint (up to 100 commits) on every commit."""
        deltalake = _deltalake()
        try:
            if self._table is not None:
                self._table.update_incremental()
                return self._table
            if not deltalake.DeltaTable.is_deltatable(self.table_uri, self._delta_options):
                return None
            self._table = deltalake.DeltaTable(self.table_uri, storage_options=self._delta_options or None)
            return self._table
        except Exception as e:
            self._table = None
            raise StorageError(f"sink {self.name}: reading the Delta log of {self.table_uri} failed: "
                               f"{type(e).__name__}: {e}") from e

    def _commit(self, files: list[dict[str, Any]], cid: int, last_epoch: int, verify_sha256: bool) -> None:
        from deltalake.exceptions import DeltaError
        from deltalake.transaction import (AddAction, CommitProperties, Transaction,
                                           create_table_with_add_actions)

        app = self._app()
        for attempt in range(3):
            table = self._load()
            if self._holds(table, app, cid, "committed"):
                return
            active = self._active(table)
            new = [f for f in files if f["path"] not in active]
            if not new:
                return  # nothing to add; an empty transaction would only grow the log
            for f in new:
                self._check_file(f, cid, verify_sha256)
            now = int(time.time() * 1000)
            adds = [AddAction(f["path"], f["size"], {}, now, True, json.dumps({"numRecords": f["rows"]}))
                    for f in new]
            props = CommitProperties(app_transactions=[Transaction(app, cid)],
                                     custom_metadata={"sparkpoint.checkpoint": cid, "sparkpoint.lastEpoch": last_epoch,
                                                      "sparkpoint.sink": self.name})
            try:
                if table is None:
                    create_table_with_add_actions(self.table_uri, self._delta_schema_of(new), adds, mode="error",
                                                  storage_options=self._delta_options or None,
                                                  commit_properties=props)
                else:
                    self._check_schema(table, new)
                    table.create_write_transaction(adds, mode="append", schema=table.schema(),
                                                   commit_properties=props)
            except (ConfigError, CorruptCheckpointError):
                raise
            except Exception as e:
                self._table = None  # the commit may or may not exist: reopen next time
                if table is None and isinstance(e, DeltaError) and "already exists" in str(e) and attempt < 2:
                    continue  # created meanwhile (an earlier attempt whose reply was lost): check txn again
                raise StorageError(f"sink {self.name}: committing checkpoint {cid} to Delta table {self.table_uri} "
                                   f"failed: {type(e).__name__}: {e}") from e
            log.info("sink %s: committed %d file(s) of checkpoint %d to Delta table %s (txn %s=%d)",
                     self.name, len(adds), cid, self.table_uri, app, cid)
            return
        raise StorageError(f"sink {self.name}: could not create Delta table {self.table_uri}: it keeps appearing "
                           f"and disappearing")

    def _holds(self, table: Any, app: str, cid: int, verb: str) -> bool:
        """Whether the table's txn record says checkpoint `cid` is in it already (a
        replayed commit is then a no-op)."""
        done = None if table is None else table.transaction_version(app)
        if done is not None and done >= cid:
            log.debug("sink %s: checkpoint %d is %s (txn %s of %s)", self.name, cid, verb, done, app)
            return True
        return False

    # -- merge by key ---------------------------------------------------------------------
    def _check_mode(self) -> None:
        """A table this job appended to is not merged into, nor the other way round: the
        two keep different records of what is committed, and a restore across the switch
        would merge appended epochs again (or append merged ones)."""
        table = self._load()
        if table is None:
            return
        merged = table.transaction_version(self._epochs_app()) is not None
        if self.merge_keys and not merged and any(_DATA_FILE.match(p) for p in self._active(table)):
            raise ConfigError(f"sink {self.name}: Delta table {self.table_uri} holds rows job {self._app()} appended "
                              f"(a DeltaSink without merge_keys); merging into it would count them twice. Write "
                              f"the merged output to a new table path, or drop merge_keys")
        if not self.merge_keys and merged:
            raise ConfigError(f"sink {self.name}: Delta table {self.table_uri} holds rows job {self._app()} merged "
                              f"by key (merge_keys); appending to it would mix the two. Pass the same merge_keys "
                              f"again, or write to a new table path")

    def _epochs_app(self) -> str:
        """The second application id of a merging sink: its version is the first epoch not
        merged yet. Delta's txn records are per app id, so both records travel in the one
        commit that merges the rows."""
        return f"{self._app()}/next-epoch"

    def _next_epoch(self, table: Any) -> int:
        return 0 if table is None else int(table.transaction_version(self._epochs_app()) or 0)

    def _merge_properties(self, cid: int, next_epoch: int, **metadata: Any):
        from deltalake.transaction import CommitProperties, Transaction

        return CommitProperties(app_transactions=[Transaction(self._app(), cid),
                                                  Transaction(self._epochs_app(), next_epoch)],
                                custom_metadata={**metadata, "sparkpoint.sink": self.name})

    def _merge(self, files: list[dict[str, Any]], cid: int, last_epoch: int, verify_sha256: bool) -> None:
        """Merge the handle's epochs that the table does not hold yet, in ONE Delta commit
        (a MERGE, or the table's creation) that also records txn(app, cid) and the next
        epoch to merge. A handle can name epochs an earlier checkpoint merged already (it
        was pre-committed before that commit ran); those are skipped, not merged again:
        their rows would undo later updates of the same keys."""
        from deltalake import write_deltalake
        from deltalake.exceptions import DeltaError

        app = self._app()
        for attempt in range(3):
            table = self._load()
            if self._holds(table, app, cid, "merged"):
                return
            first = self._next_epoch(table)
            pending = [f for f in files if f["epoch"] >= first]
            if not pending:
                return
            for f in pending:
                self._check_file(f, cid, verify_sha256)
            if table is None:
                self._delta_schema_of(pending)
            else:
                self._check_schema(table, pending)
            updates = self._read_updates(pending)
            props = self._merge_properties(cid, last_epoch + 1, **{"sparkpoint.checkpoint": cid,
                                                                   "sparkpoint.lastEpoch": last_epoch})
            try:
                if table is None:
                    write_deltalake(self.table_uri, updates, mode="error", storage_options=self._delta_options or None,
                                    commit_properties=props)
                    metrics = {"num_target_rows_inserted": updates.num_rows}
                else:
                    metrics = (table.merge(updates, merge_predicate(self.merge_keys), source_alias="source",
                                           target_alias="target", commit_properties=props)
                               .when_matched_update_all().when_not_matched_insert_all().execute())
            except (ConfigError, CorruptCheckpointError):
                raise
            except Exception as e:
                self._table = None
                if table is None and isinstance(e, DeltaError) and "already exists" in str(e) and attempt < 2:
                    continue
                raise StorageError(f"sink {self.name}: merging checkpoint {cid} into Delta table {self.table_uri} "
                                   f"failed: {type(e).__name__}: {e}") from e
            log.info("sink %s: merged %d row(s) of epochs %d..%d (checkpoint %d) into Delta table %s by %s: %s "
                     "updated, %s inserted (txn %s=%d)", self.name, updates.num_rows, first, last_epoch, cid,
                     self.table_uri, list(self.merge_keys), metrics.get("num_target_rows_updated", 0),
                     metrics.get("num_target_rows_inserted", 0), app, cid)
            return
        raise StorageError(f"sink {self.name}: could not create Delta table {self.table_uri}: it keeps appearing "
                           f"and disappearing")

    def _read_updates(self, files: list[dict[str, Any]]) -> pa.Table:
        """The staged rows in the order they were written (epoch, task, row), one per key."""
        tables = []
        for f in sorted(files, key=lambda f: (f["epoch"], f["part"], f["path"])):
            with self._storage.fs.open(self._abs(f["path"]), "rb") as fh:
                tables.append(pq.read_table(fh).replace_schema_metadata(None))
        rows = pa.concat_tables(tables, promote_options="default")
        return last_per_key(self.name, rows, self.merge_keys)

    def _rewind_merged(self, last_epoch: int, cid: int) -> None:
        """On restore: bring the table back to what checkpoint `cid` (epochs up to
        `last_epoch`) produced, when it holds rows of later epochs (a restore that fell
        back past a corrupt checkpoint whose output was merged, or a fresh start). Merged
        rows cannot be withdrawn file by file, so the table is restored (Delta RESTORE) to
        its latest version that holds no later epoch, or emptied when none does; the same
        commit records the txn and the next epoch to merge, so the handle's epochs not in
        that version are merged again, and later checkpoints are not mistaken for merged."""
        from deltalake.transaction import RemoveAction

        app = self._app()
        table = self._load()
        if table is None:
            return
        held, recorded = self._next_epoch(table), table.transaction_version(app)
        if held <= last_epoch + 1:
            wanted = cid if held == last_epoch + 1 else max(cid - 1, 0)
            if recorded is not None and recorded > wanted:
                self._record_merged(table, [], wanted, held, last_epoch)
            return
        version, held = self._version_holding_epochs_before(table, last_epoch + 1)
        wanted = cid if held == last_epoch + 1 else max(cid - 1, 0)
        if version is None:
            drop = self._active(table)
            log.warning("sink %s: emptying Delta table %s: it holds merged rows of epochs up to %d, after the restored "
                        "point (epoch %d); those epochs are produced again", self.name, self.table_uri,
                        self._next_epoch(table) - 1, last_epoch)
            now = int(time.time() * 1000)
            self._record_merged(table, [RemoveAction(p, True, now, size, {}) for p, size in sorted(drop.items())],
                                wanted, 0, last_epoch)
            return
        log.warning("sink %s: restoring Delta table %s to version %d (merged epochs before %d): it holds merged rows "
                    "of epochs after the restored point (epoch %d); those epochs are produced again", self.name,
                    self.table_uri, version, held, last_epoch)
        props = self._merge_properties(wanted, held, **{"sparkpoint.restoredCheckpoint": cid,
                                                        "sparkpoint.lastEpoch": last_epoch})
        try:
            table.restore(version, commit_properties=props)
        except Exception as e:
            self._table = None
            raise StorageError(f"sink {self.name}: restoring Delta table {self.table_uri} to version {version}, the "
                               f"last before epoch {last_epoch + 1} was merged, failed: {type(e).__name__}: {e}. If "
                               f"its data files were vacuumed, the table cannot go back: write to a new table path "
                               f"and start the job with restore.mode=empty") from e

    def _version_holding_epochs_before(self, table: Any, next_epoch: int) -> tuple[int | None, int]:
        """The latest table version whose merged epochs all come before `next_epoch`, and
        its next epoch; (None, 0) if every version holds later epochs."""
        deltalake = _deltalake()
        past = deltalake.DeltaTable(self.table_uri, storage_options=self._delta_options or None)
        for version in range(table.version() - 1, -1, -1):
            try:
                past.load_as_version(version)
            except Exception as e:
                if next_epoch == 0:
                    # A fresh start withdraws everything the job merged: no old version needed.
                    log.info("sink %s: version %d of Delta table %s cannot be read (%s); emptying the table",
                             self.name, version, self.table_uri, e)
                    return None, 0
                raise StorageError(f"sink {self.name}: reading version {version} of Delta table {self.table_uri} "
                                   f"to rewind it failed: {type(e).__name__}: {e}") from e
            held = self._next_epoch(past)
            if held <= next_epoch:
                return version, held
        return None, 0

    def _record_merged(self, table: Any, actions: list[Any], cid: int, next_epoch: int, last_epoch: int) -> None:
        props = self._merge_properties(cid, next_epoch, **{"sparkpoint.restoredCheckpoint": cid,
                                                           "sparkpoint.lastEpoch": last_epoch})
        try:
            table.create_write_transaction(actions, mode="append", schema=table.schema(), commit_properties=props)
        except Exception as e:
            self._table = None
            raise StorageError(f"sink {self.name}: rewinding Delta table {self.table_uri} to epoch {last_epoch} "
                               f"failed: {type(e).__name__}: {e}") from e

    def _check_file(self, f: dict[str, Any], cid: int, verify_sha256: bool) -> None:
        path = self._abs(f["path"])
        if not self._storage.exists(path):
            raise CorruptCheckpointError(
                f"sink {self.name}: data file {path} of checkpoint {cid} (epoch {f['epoch']}, {f['rows']} rows) is "
                f"missing and the Delta log does not name it. Was the table directory changed by hand (or vacuumed "
                f"while the job was down)? Restoring an older checkpoint produces its rows again")
        size = self._storage.size(path)
        if size != f["size"] or (verify_sha256 and self._storage.sha256(path) != f["sha256"]):
            raise CorruptCheckpointError(
                f"sink {self.name}: data file {path} of checkpoint {cid} does not match its handle (expected "
                f"{f['size']} bytes, sha256 {f['sha256']}; found {size} bytes); it is not committed")

    def _read_schema(self, f: dict[str, Any]) -> pa.Schema:
        # Only the footer is read; nothing from storage is unpickled.
        with self._storage.fs.open(self._abs(f["path"]), "rb") as fh:
            return pq.read_schema(fh)

    def _delta_schema_of(self, files: list[dict[str, Any]]):
        from deltalake import Schema

        fingerprints = {f["schema"] for f in files}
        if len(fingerprints) > 1:
            raise ConfigError(f"sink {self.name}: the output's schema changed between epochs "
                              f"{sorted({f['epoch'] for f in files})}; a Delta table has one schema")
        schema = self._read_schema(files[0])
        try:
            delta_schema = Schema.from_arrow(schema)
        except Exception as e:
            raise ConfigError(f"sink {self.name}: the output's schema cannot be a Delta table's ({e}): {schema}. "
                              f"Cast the unsupported columns in the pipeline before the sink") from e
        self._schemas_ok |= fingerprints
        return delta_schema

    def _check_schema(self, table: Any, files: list[dict[str, Any]]) -> None:
        from deltalake import Schema

        for fingerprint in sorted({f["schema"] for f in files} - self._schemas_ok):
            sample = next(f for f in files if f["schema"] == fingerprint)
            schema = self._read_schema(sample)
            try:
                ours = _columns(Schema.from_arrow(schema))
            except Exception as e:
                raise ConfigError(f"sink {self.name}: the output's schema cannot be a Delta table's ({e}): "
                                  f"{schema}") from e
            theirs = _columns(table.schema())
            if ours != theirs:
                raise ConfigError(
                    f"sink {self.name}: epoch {sample['epoch']}'s output columns {_show(ours)} differ from those of "
                    f"the Delta table {self.table_uri}: {_show(theirs)}. Write to a new table path, or change "
                    f"the pipeline so its output matches the table")
            self._schemas_ok.add(fingerprint)

    def _active(self, table: Any) -> dict[str, int]:
        """Path -> size of every file an active `add` names (all writers' files)."""
        if table is None:
            return {}
        actions = pa.table(table.get_add_actions(flatten=True))
        return dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()))

    def _withdraw_after(self, last_epoch: int, cid: int) -> None:
        """Take this layout's files of epochs after `last_epoch` out of the table and record
        txn version `cid` for the app id, in one transaction: those epochs run again, and
        their new commits (checkpoint ids above the restored one) must not be skipped."""
        from deltalake.transaction import CommitProperties, RemoveAction, Transaction

        app = self._app()
        table = self._load()
        if table is None:
            return
        drop = {p: size for p, size in self._active(table).items()
                if (epoch := _epoch_of(p)) is not None and epoch > last_epoch}
        recorded = table.transaction_version(app)
        if not drop and (recorded is None or recorded <= cid):
            return
        if drop:
            log.warning("sink %s: withdrawing %d committed file(s) of epochs after %d from Delta table %s: the "
                        "restored checkpoint is older than the output (a fresh start, or a restore that fell back "
                        "past a corrupt checkpoint); those epochs are produced again", self.name, len(drop),
                        last_epoch, self.table_uri)
        now = int(time.time() * 1000)
        removes = [RemoveAction(p, True, now, size, {}) for p, size in sorted(drop.items())]
        props = CommitProperties(app_transactions=[Transaction(app, cid)],
                                 custom_metadata={"sparkpoint.restoredCheckpoint": cid,
                                                  "sparkpoint.lastEpoch": last_epoch, "sparkpoint.sink": self.name})
        try:
            table.create_write_transaction(removes, mode="append", schema=table.schema(), commit_properties=props)
        except Exception as e:
            self._table = None
            raise StorageError(f"sink {self.name}: withdrawing output after epoch {last_epoch} from Delta table "
                               f"{self.table_uri} failed: {type(e).__name__}: {e}") from e

    def _delete_orphans(self) -> None:
        """Data files of this layout that no active `add` names: losing task attempts,
        epochs after the restored checkpoint, withdrawn output. One recursive listing (on
        S3 a flat, paginated one), not one per epoch directory."""
        active = self._active(self._load())
        prefix = self.root + "/"
        emptied = set()
        for found in self._storage.find(self.root):
            relative = found.path[len(prefix):] if found.path.startswith(prefix) else None
            if relative and _DATA_FILE.match(relative) and relative not in active:
                self._storage.rm(found.path)
                emptied.add(relative.split("/", 1)[0])
        if self._storage.is_local:
            for name in sorted(emptied):
                try:
                    os.rmdir(self._abs(name))  # only if empty: a committed file may share it
                except OSError:
                    pass

    def _forget(self, files: list[dict[str, Any]], last_epoch: int) -> None:
        """After a commit covering epochs up to `last_epoch`: drop them from the staged set
        and delete their data files that the handle does not name (losing task attempts).
        Best effort: recovery deletes them anyway."""
        with self._lock:
            for path in [p for p, f in self._staged.items() if f["epoch"] <= last_epoch]:
                del self._staged[path]
        # A merged file's rows are in the table's own files now: none is kept.
        keep = set() if self.merge_keys else {f["path"] for f in files}
        try:
            for epoch in sorted({f["epoch"] for f in files}):
                directory = epoch_dir(epoch)
                for file in self._storage.ls(self._abs(directory)):
                    relative = f"{directory}/{file}"
                    if _DATA_FILE.match(relative) and relative not in keep:
                        self._storage.rm(self._abs(relative))
                if self.merge_keys and self._storage.is_local:
                    try:
                        os.rmdir(self._abs(directory))
                    except OSError:
                        pass
        except Exception as e:
            log.warning("sink %s: could not clean up losing task attempts up to epoch %d: %s", self.name,
                        last_epoch, e)

    # -- reading the log (never the data) ----------------------------------------------
    def committed_files(self) -> list[str]:
        """The table's active data files, relative to its root."""
        return sorted(self._active(self._load()))

    def committed_epochs(self) -> list[int]:
        if self.merge_keys:
            return list(range(self._next_epoch(self._load())))
        return sorted({e for p in self._active(self._load()) if (e := _epoch_of(p)) is not None})

    def transaction_version(self) -> int | None:
        """The checkpoint id the table records as committed for this sink's app id."""
        table = self._load()
        return None if table is None else table.transaction_version(self._app())


def read_committed(path: str, storage_options: dict[str, Any] | None = None,
                   delta_storage_options: dict[str, str] | None = None) -> pa.Table:
    """The table's rows as one Arrow table, read by delta-rs (exactly the committed
    files). For tests and small outputs."""
    sink = DeltaSink(path, storage_options=storage_options, delta_storage_options=delta_storage_options)
    table = sink._load()
    return pa.table({}) if table is None else table.to_pyarrow_table()


def _columns(schema: Any) -> list[tuple[str, str]]:
    doc = json.loads(schema.to_json())
    return [(f["name"], json.dumps(f["type"], sort_keys=True)) for f in doc["fields"]]


def _show(columns: list[tuple[str, str]]) -> str:
    def kind(t: str) -> str:
        value = json.loads(t)
        return value if isinstance(value, str) else t
    return "(" + ", ".join(f"{name} {kind(t)}" for name, t in columns) + ")"


def _epoch_of(relative: str) -> int | None:
    m = _DATA_FILE.match(relative)
    return int(m.group(1)) if m else None


# -- handles are untrusted when read back from a checkpoint --------------------------------
def _validate_file(f: Any, where: str) -> dict[str, Any]:
    def bad(why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"delta sink {where}: {why}: {f!r:.300}")

    if not isinstance(f, Mapping):
        raise bad("not an object")
    path = f.get("path")
    m = _DATA_FILE.match(path) if isinstance(path, str) else None
    if not m:
        raise bad("path is not a data file of this sink (epoch-<e>/part-<n>-<uuid>.parquet)")
    ints = {k: f.get(k) for k in ("epoch", "part", "size", "rows")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints.values()):
        raise bad("epoch, part, size and rows must be non-negative integers")
    if int(m.group(1)) != ints["epoch"] or int(m.group(2)) != ints["part"]:
        raise bad("path does not match epoch and part")
    sha, fingerprint = f.get("sha256"), f.get("schema")
    if not isinstance(sha, str) or len(sha) != 64 or not _HEX.match(sha):
        raise bad("sha256 is not a hex SHA-256")
    if not isinstance(fingerprint, str) or len(fingerprint) != 16 or not _HEX.match(fingerprint):
        raise bad("schema is not a schema fingerprint")
    return {**ints, "path": path, "sha256": sha, "schema": fingerprint}


def _validate_handle(handle: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int, int]:
    ok = isinstance(handle, Mapping) and handle.get("v") == HANDLE_VERSION and isinstance(handle.get("files"), list)
    ints = [handle.get(k) for k in ("last_epoch", "checkpoint")] if ok else []
    if not ok or not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or ints[1] < 1:
        raise CorruptCheckpointError(f"delta sink handle is not one this version writes "
                                     f"(v={HANDLE_VERSION}, checkpoint, last_epoch, files): {handle!r:.300}")
    where = f"checkpoint {handle['checkpoint']} file"
    return [_validate_file(f, where) for f in handle["files"]], int(handle["last_epoch"]), int(handle["checkpoint"])
