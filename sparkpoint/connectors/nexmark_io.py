"""Where the Nexmark example pipelines (examples/nexmark/) read and write.

    NEXMARK_INPUT=DIR    read DIR/person/, DIR/auction/ and DIR/bid/ (written by
                         `sparkpoint nexmark generate`) as bounded input: Parquet files in
                         name order, which is event-time order for that command's files
    (unset)              generate the events: NEXMARK_EVENTS of them (default 1 000 000)
                         with NEXMARK_SEED (default 0)
    NEXMARK_OUTPUT=DIR   committed output (default nexmark-output/<query>)

Every stream carries nexmark-flink's watermark, `dateTime - INTERVAL '4' SECOND`.
"""

from __future__ import annotations

import os

from sparkpoint.connectors.base import Source
from sparkpoint.connectors.files import FileSource
from sparkpoint.connectors.nexmark_source import DDL, NexmarkSource, check_stream
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.errors import ConfigError

EVENT_TIME = "dateTime"
WATERMARK_DELAY = "4 s"
DEFAULT_EVENTS = 1_000_000
# nexmark-flink's side input for q13 (its SideInputGenerator): keys 0 .. 9999, value = key.
SIDE_INPUT_ROWS = 10_000


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} must be >= 0")
    return value


def nexmark_input(stream: str, *, max_files_per_epoch: int | None = None) -> Source:
    """The source of one stream: Parquet files under $NEXMARK_INPUT/<stream>/ when
    NEXMARK_INPUT is set (NEXMARK_FILES_PER_EPOCH of them per epoch, default 10), else the
    generator (NEXMARK_EVENTS, NEXMARK_SEED)."""
    check_stream(stream)
    directory = os.environ.get("NEXMARK_INPUT")
    if directory:
        path = os.path.join(directory, stream)
        if not os.path.isdir(path):
            raise ConfigError(f"NEXMARK_INPUT={directory} has no {stream}/ directory: write the input with "
                              f"`sparkpoint nexmark generate --events N --out {directory}`")
        if max_files_per_epoch is None:
            max_files_per_epoch = _env_int("NEXMARK_FILES_PER_EPOCH", 10) or 10
        return FileSource(path, format="parquet", schema=DDL[stream], name=stream, bounded=True,
                          max_files_per_epoch=max_files_per_epoch)
    return NexmarkSource(stream, events=_env_int("NEXMARK_EVENTS", DEFAULT_EVENTS),
                         seed=_env_int("NEXMARK_SEED", 0))


def nexmark_output(query: str) -> ParquetSink:
    """Exactly-once Parquet files in $NEXMARK_OUTPUT (default nexmark-output/<query>)."""
    return ParquetSink(os.environ.get("NEXMARK_OUTPUT") or os.path.join("nexmark-output", query))


def side_input_path() -> str:
    """q13's side input: $NEXMARK_SIDE_INPUT, else side_input.csv beside the input streams
    ($NEXMARK_INPUT), else in nexmark-output/. Written on first use (`write_side_input`)."""
    explicit = os.environ.get("NEXMARK_SIDE_INPUT")
    path = os.path.abspath(explicit or os.path.join(os.environ.get("NEXMARK_INPUT") or "nexmark-output",
                                                    "side_input.csv"))
    if not os.path.exists(path):
        write_side_input(path)
    return path


def write_side_input(path: str, rows: int = SIDE_INPUT_ROWS) -> None:
    """nexmark-flink's side input file: one line `key,value` per key 0 .. rows-1, the value
    the key's digits. The same content every time, so a concurrent writer is harmless."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(f"{i},{i}\n" for i in range(rows))
    os.replace(tmp, path)
