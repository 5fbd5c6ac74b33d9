"""Reading a Delta table back the way its readers do, through delta-rs (not through
sparkpoint). On S3 it uses the run's S3 server (tests/servers/s3_server.py), a process of
its own: delta-rs holds the GIL while it waits for S3, so a server answering from a
thread of the test's process would wait for the GIL the request holds."""

from __future__ import annotations

import pyarrow as pa


def read_delta(url: str, delta_options: dict[str, str] | None = None) -> pa.Table:
    """Everything the table's readers see, through delta-rs (not through sparkpoint)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(url, delta_options):
        return pa.table({})
    return DeltaTable(url, storage_options=delta_options).to_pyarrow_table()
