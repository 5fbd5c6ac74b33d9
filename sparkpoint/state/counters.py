"""A count kept in a subtask store's metadata, so it is checkpointed, restored and
replayed with the state it describes (rows a step dropped as late, for instance): an
epoch that is run again after a failure counts its rows again on top of the restored
value, never twice."""

from __future__ import annotations


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
