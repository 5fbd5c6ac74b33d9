"""Real RocksDB stores (rocksdict, raw bytes) and a local directory as checkpoint storage."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import rocksdict

from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout


@dataclass
class Remote:
    fs: StorageFS
    layout: JobLayout

    @classmethod
    def at(cls, directory: Path) -> "Remote":
        directory.mkdir(parents=True, exist_ok=True)
        fs = StorageFS.from_url(str(directory))
        return cls(fs, JobLayout(f"{fs.root}/job"))

    def all_files(self) -> set[str]:
        """Every file under the job root, relative to it."""
        root = Path(self.layout.root)
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()

    def local_path(self, relative: str) -> Path:
        return Path(self.layout.join(relative))


def open_db(path: Path) -> rocksdict.Rdict:
    return rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True))


def put_keys(db: rocksdict.Rdict, keys: range, seed: int) -> dict[bytes, bytes]:
    """Write incompressible values (so byte counts mean something); returns what was written."""
    rng = random.Random(seed)
    written = {}
    batch = rocksdict.WriteBatch(raw_mode=True)
    for i in keys:
        key, value = b"key-%08d" % i, rng.randbytes(48)
        batch.put(key, value)
        written[key] = value
    db.write(batch)
    return written


def local_checkpoint(db: rocksdict.Rdict, directory: Path) -> Path:
    directory.parent.mkdir(parents=True, exist_ok=True)
    rocksdict.Checkpoint(db).create_checkpoint(str(directory))
    return directory


def read_all(path: Path) -> dict[bytes, bytes]:
    db = open_db(path)
    try:
        return dict(db.items())
    finally:
        db.close()


def largest_sst(handle: dict) -> dict:
    return max((f for f in handle["files"] if f["name"].endswith(".sst")), key=lambda f: f["size"])


# -- ways a real SST gets damaged -----------------------------------------------------

def bad_magic(path: Path) -> None:
    """RocksDB's "Bad table magic number": the footer's last 8 bytes are wrong."""
    data = bytearray(path.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    path.write_bytes(bytes(data))


def flipped_data_block(path: Path) -> None:
    """Bit rot inside the first data block: size unchanged, footer intact."""
    data = bytearray(path.read_bytes())
    for i in range(64, 80):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def truncated(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def missing(path: Path) -> None:
    path.unlink()
