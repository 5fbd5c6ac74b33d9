"""Values kept in a subtask store's metadata, so they are checkpointed, restored and
re-run with the state they describe.

`StoredCounter`: a count (rows a step dropped as late, for instance): an epoch that runs
again after a failure counts its rows again on top of the restored value, never twice.

`StoredSchema`: the Arrow schema a step's stored rows were written with (IPC bytes, never
pickle), so a worker that has not seen this epoch's input schema still reads them.
"""

from __future__ import annotations

import pyarrow as pa


class StoredCounter:
    def __init__(self, meta_name: str):
        self.meta_name = meta_name

    def value(self, store) -> int:
        """The count so far: committed epochs plus this epoch's own additions."""
        raw = store.get_meta(self.meta_name)
        return 0 if raw is None else int.from_bytes(raw, "big")

    def add(self, store, n: int) -> None:
        if n:
            store.put_meta(self.meta_name, (self.value(store) + int(n)).to_bytes(8, "big"))


class StoredSchema:
    def __init__(self, meta_name: str):
        self.meta_name = meta_name

    def read(self, store) -> pa.Schema | None:
        raw = store.get_meta(self.meta_name)
        return None if raw is None else pa.ipc.read_schema(pa.py_buffer(raw))

    def keep(self, store, schema: pa.Schema) -> None:
        """Record `schema` once: the first one a store sees is what its rows are in."""
        if store.get_meta(self.meta_name) is None:
            store.put_meta(self.meta_name, schema.serialize().to_pybytes())
