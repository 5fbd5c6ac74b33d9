"""Full vs incremental state snapshot upload, and verified restore, on a real RocksDB store.

    python bench/snapshot_upload.py [--keys 1000000] [--changed 0.01] [--value-bytes 48]

Builds a store of --keys keys (incompressible values), takes a hard-link checkpoint and
uploads it in full to a local directory used as checkpoint storage; then changes
--changed of the keys, checkpoints again and uploads incrementally. Then restores the
second checkpoint twice: from storage (download + sha256 of every file) and from the
local recovery copy (sha256 + hard links). Prints bytes and wall-clock durations.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import rocksdict

from sparkpoint.state.restore import restore_snapshot
from sparkpoint.state.snapshot import SnapshotHandleIndex
from sparkpoint.state.upload import FileHashCache, UploadResult, upload_snapshot
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout

_BATCH = 50_000


def write_keys(db: rocksdict.Rdict, keys: range | list[int], value_bytes: int, rng: random.Random) -> None:
    batch = rocksdict.WriteBatch(raw_mode=True)
    for n, i in enumerate(keys, 1):
        batch.put(b"key-%010d" % i, rng.randbytes(value_bytes))
        if n % _BATCH == 0:
            db.write(batch)
            batch = rocksdict.WriteBatch(raw_mode=True)
    db.write(batch)


def checkpoint(db: rocksdict.Rdict, directory: Path) -> Path:
    rocksdict.Checkpoint(db).create_checkpoint(str(directory))
    return directory


def describe(label: str, result: UploadResult) -> None:
    m = result.metrics
    print(f"{label:<12} uploaded {m.bytes_uploaded / 1e6:9.2f} MB in {m.files_uploaded:3d} files, "
          f"reused {m.bytes_reused / 1e6:9.2f} MB in {m.files_reused:3d} files, {m.duration_s:6.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of keys changed")
    parser.add_argument("--value-bytes", type=int, default=48)
    args = parser.parse_args()

    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-") as tmp:
        root = Path(tmp)
        fs = StorageFS.from_url(str(root / "remote"))
        layout = JobLayout(f"{fs.root}/bench")
        cache = FileHashCache()
        db = rocksdict.Rdict(str(root / "db"), rocksdict.Options(raw_mode=True))

        started = time.monotonic()
        write_keys(db, range(args.keys), args.value_bytes, rng)
        print(f"store: {args.keys:,} keys x {args.value_bytes} B values, "
              f"written in {time.monotonic() - started:.1f} s")

        full = upload_snapshot(str(checkpoint(db, root / "chk-1")), fs, layout, 1, "bench/0",
                               hash_cache=cache)
        changed = rng.sample(range(args.keys), int(args.keys * args.changed))
        write_keys(db, changed, args.value_bytes, rng)
        incremental = upload_snapshot(str(checkpoint(db, root / "chk-2")), fs, layout, 2, "bench/0",
                                      previous=SnapshotHandleIndex.from_handles([full.handle]),
                                      hash_cache=cache)
        db.close()
        describe("full", full)
        describe(f"incremental ({args.changed:.0%} changed)", incremental)
        print(f"incremental / full bytes uploaded: "
              f"{incremental.metrics.bytes_uploaded / full.metrics.bytes_uploaded:.2%}")

        remote = restore_snapshot(incremental.handle, fs, layout, str(root / "restored-remote"))
        local = restore_snapshot(incremental.handle, fs, layout, str(root / "restored-local"),
                                 local_copy_dir=str(root / "chk-2"))
        print(f"restore from storage:    {remote.bytes_remote / 1e6:9.2f} MB verified in {remote.duration_s:6.2f} s")
        print(f"restore from local copy: {local.bytes_local / 1e6:9.2f} MB verified in {local.duration_s:6.2f} s")


if __name__ == "__main__":
    main()
