"""A key group's state entry held as one Arrow IPC stream: the table and its schema
(a flatbuffer, never a pickle), tagged in the schema metadata with the layout that
wrote it, so a reader needs nothing else to decode it.

The window layouts (window_tables.py, pane_tables.py, session_tables.py) store their
group tables this way; each names its own entries and writers in the error lines."""

from __future__ import annotations

from collections.abc import Collection

import pyarrow as pa

from sparkpoint.errors import StateSchemaError

LAYOUT_KEY = b"sparkpoint.layout"
_OPTIONS = pa.ipc.IpcWriteOptions()  # given, so a writer does not look up its defaults in the environment


def encode(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode(raw: bytes, where: str, entry: str, writer: str, layouts: Collection[bytes]) -> pa.Table:
    """The table of one stored entry whose layout tag is one of `layouts`. Raises
    StateSchemaError, naming `where` and the `entry` ("a window table entry"), if it is
    not an Arrow IPC stream (not written by `writer` of this version) or has another tag."""
    try:
        with pa.ipc.open_stream(pa.py_buffer(raw)) as reader:
            table = reader.read_all()
    except pa.ArrowInvalid as e:
        raise StateSchemaError(f"{where}: {entry} is not an Arrow IPC stream ({e}); the state was not written by "
                               f"{writer} of this version") from e
    layout = (table.schema.metadata or {}).get(LAYOUT_KEY)
    if layout not in layouts:
        wanted = f"{next(iter(layouts))!r}" if len(layouts) == 1 else f"one of {sorted(layouts)!r}"
        raise StateSchemaError(f"{where}: {entry} has the layout {layout!r}, not {wanted}; read it with the "
                               "sparkpoint version that wrote it")
    return table
