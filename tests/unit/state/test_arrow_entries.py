"""The group tables of tumbling, sliding, cumulate and session windows are stored as
Arrow IPC streams; an entry that is not one, or that another layout wrote, is refused
with one line naming the entry's kind, where it was, and what to do."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from sparkpoint.errors import StateSchemaError
from sparkpoint.state import pane_tables, session_tables, window_tables

WHERE = "SessionWindow 's', key group 5"
_KEYS = [pa.field("k", pa.string())]


def _decode(layout):
    return {"window": window_tables.decode, "pane": pane_tables.decode, "session": session_tables.decode}[layout]


@pytest.mark.parametrize("layout,writer", [("window", "a TumblingWindow"),
                                           ("pane", "a sliding or cumulate window"),
                                           ("session", "a SessionWindow")])
def test_an_entry_that_is_not_an_arrow_stream_is_one_line_naming_its_layout_and_writer(layout, writer) -> None:
    with pytest.raises(StateSchemaError) as raised:
        _decode(layout)(b"not arrow", WHERE)
    line = str(raised.value)
    assert "\n" not in line
    assert re.fullmatch(re.escape(f"{WHERE}: a {layout} table entry is not an Arrow IPC stream (") + r"[^;]+"
                        + re.escape(f"); the state was not written by {writer} of this version"), line), line


def test_an_entry_another_layout_wrote_is_one_line_naming_both_layouts() -> None:
    sessions = session_tables.encode(session_tables.table_schema(_KEYS, None).empty_table(),
                                      session_tables.shape_metadata(0, "final"))
    panes = pane_tables.encode(pane_tables.table_schema(_KEYS, None).empty_table(),
                               pane_tables.shape_metadata(pane_tables.CUMULATE, 10, 5, 0, "final"), 7)
    with pytest.raises(StateSchemaError) as raised:
        pane_tables.decode(sessions, WHERE)
    assert str(raised.value) == (f"{WHERE}: a pane table entry has the layout b'session-table/1', not one of "
                                 "[b'cumulate-pane-table/1', b'sliding-pane-table/1']; read it with the sparkpoint "
                                 "version that wrote it")
    with pytest.raises(StateSchemaError) as raised:
        session_tables.decode(panes, WHERE)
    assert str(raised.value) == (f"{WHERE}: a session table entry has the layout b'cumulate-pane-table/1', not "
                                 "b'session-table/1'; read it with the sparkpoint version that wrote it")
    with pytest.raises(StateSchemaError) as raised:
        window_tables.decode(panes, WHERE)
    assert str(raised.value) == (f"{WHERE}: a window table entry has the layout b'cumulate-pane-table/1', not "
                                 "b'tumbling-window-table/1'; read it with the sparkpoint version that wrote it")


def test_an_entry_reads_back_as_written_with_its_shape() -> None:
    table = pa.table({"k": ["a", None], "pane_start": [0, 5], "count": [2, 1]})
    table = table.cast(pane_tables.table_schema(_KEYS, None))
    got, fired_through = pane_tables.decode(
        pane_tables.encode(table, pane_tables.shape_metadata(pane_tables.SLIDING, 10, 5, 0, "update"), 7), WHERE)
    assert (got.to_pylist(), fired_through, pane_tables.shape(got)) == (table.to_pylist(), 7, (10, 5, 0, "update"))
