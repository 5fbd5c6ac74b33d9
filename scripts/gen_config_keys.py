"""Writes docs/config-keys.md from sparkpoint/config.py: every key, its default, its
unit and the comment above its field. `python scripts/gen_config_keys.py --check`
fails if the page is out of date (tests/unit/test_docs_config_keys.py runs it)."""

from __future__ import annotations

import re
import sys
import types
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkpoint.config import Settings  # noqa: E402

PAGE = REPO / "docs" / "config-keys.md"
HEADER = """# Configuration keys

Generated from `sparkpoint/config.py` by `python scripts/gen_config_keys.py`; do not edit.
Set keys in a YAML file (`--config`), in environment variables (`SPARKPOINT_` + the key in
capitals with `.` and `-` as `_`, e.g. `SPARKPOINT_EXECUTION_CHECKPOINTING_DIR`), with
`--set key=value`, or from Python (`Settings.load(overrides={...})`), later ones winning. One
Spark setting: `--set spark.conf.spark.executor.memory=4g` (see [deploy.md](deploy.md)).
**Durations** take a unit: `500 ms`, `2 s`, `1 min`,
`1 h`; a bare number is milliseconds (Flink's rule), so `30` means 30 ms.

| key | default | unit / type | what it is |
|---|---|---|---|
"""


def _duration_fields() -> set[str]:
    fields: set[str] = set()
    for dec in Settings.__pydantic_decorators__.field_validators.values():
        if dec.func.__name__ in ("_duration", "_duration_ms"):
            fields |= set(dec.info.fields)
    return fields


def _comments() -> dict[str, str]:
    """The comment lines right above each field, joined."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in (REPO / "sparkpoint" / "config.py").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = []
        elif stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
        else:
            m = re.match(r"\s+(\w+):.*Field\(", line)
            if m:
                out[m.group(1)] = " ".join(pending)
            pending = []
    return out


def _memory_fields() -> set[str]:
    return {f for dec in Settings.__pydantic_decorators__.field_validators.values()
            if dec.func.__name__ == "_memory_size" for f in dec.info.fields}


def _kind(name: str, annotation, durations: set[str]) -> str:
    if name in durations:
        return "duration (bare number: ms)"
    if name in _memory_fields():
        return "memory size (`256 mb`, `1 gb`; bare number: bytes)"
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(annotation))
    base = annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # X | None
        base = next(a for a in typing.get_args(annotation) if a is not type(None))
    origin = typing.get_origin(base) or base
    return {int: "integer", float: "number", bool: "`true` / `false`", str: "string",
            dict: "map", list: "list"}.get(origin, str(base))


def _duration(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


DESCRIPTIONS = {  # keys whose field has no comment in config.py
    "pipeline.name": "the job's name: its directory under the checkpoint dir, its lease, its metrics label",
    "execution.checkpointing.dir": "checkpoint storage: a local path, NFS, or `s3://bucket/prefix`",
    "execution.checkpointing.interval": "how often a checkpoint is triggered",
    "execution.checkpointing.min-pause": "least time between the end of one checkpoint and the start of the next",
    "execution.checkpointing.timeout": "a checkpoint not completed within this expires (a counted failure)",
    "execution.checkpointing.max-concurrent-checkpoints": "checkpoints in flight at once",
    "execution.checkpointing.num-retained": "completed checkpoints kept",
    "execution.checkpointing.enabled": "periodic checkpoints (a bounded job still takes a final one)",
    "execution.checkpointing.storage-options": "fsspec options for the checkpoint storage (e.g. an S3 endpoint)",
    "parallelism.default": "subtasks of the stateful step",
    "pipeline.max-parallelism": "key groups; cannot change across a restore",
    "restart-strategy.type": "what happens after a failure (Flink's strategies)",
    "restart-strategy.fixed-delay.attempts": "fixed-delay: restarts before the job fails",
    "restart-strategy.fixed-delay.delay": "fixed-delay: wait before each restart",
    "restart-strategy.exponential-delay.initial-backoff": "exponential-delay: wait before the first restart",
    "restart-strategy.exponential-delay.max-backoff": "exponential-delay: the longest wait between restarts",
    "restart-strategy.exponential-delay.backoff-multiplier": "exponential-delay: each wait is the previous one times this",
    "restart-strategy.exponential-delay.reset-backoff-threshold": ("exponential-delay: a job that ran this long "
                                                                   "without failing starts again at the initial backoff"),
    "restart-strategy.exponential-delay.jitter-factor": ("exponential-delay: each wait varies randomly by up to "
                                                         "this share, so many jobs do not restart in step"),
    "restart-strategy.exponential-delay.attempts-before-reset-backoff": ("exponential-delay: restarts before the job "
                                                                         "fails, counted since the last reset"),
    "restart-strategy.failure-rate.max-failures-per-interval": "failure-rate: failures within the interval before the job fails",
    "restart-strategy.failure-rate.failure-rate-interval": "failure-rate: the window failures are counted in",
    "restart-strategy.failure-rate.delay": "failure-rate: wait before each restart",
    "state.changelog.max-changelogs": "change logs a rebuild replays at most before a snapshot is forced",
    "execution.state-recovery.claim-mode": ("`NO_CLAIM` (the only mode): the job never deletes or references the "
                                            "savepoint's files, it copies what it needs"),
    "rest.port": "the REST API's port (Flink's); `0` any free port; a taken port falls back to a free one",
    "rest.bind-address": "the REST API's address: loopback unless set; any other needs `rest.token`",
    "state.local.dir": ("each executor's local state (RocksDB working copies): a cache. A job's stores are under "
                        "`<state.local.dir>/<job name>-<8 hex digits>/`, the digits a hash of the job's checkpoint "
                        "location, so runs of one job name with different checkpoint directories never share them"),
    "restore.mode": "`latest` resumes from the latest checkpoint; `empty` starts from scratch on purpose",
    "spark.master": "any master Spark accepts: `local[N]`, `spark://`, `yarn`, `k8s://`",
    "spark.remote": "a Spark Connect server to run on instead of a master: `sc://HOST:PORT` "
                    "(Spark's `SPARK_REMOTE` when unset; docs/connect.md)",
    "spark.conf": "extra Spark settings",
    "sparkpoint.idle-pause": "sleep between polls of a source with no new input",
    "sparkpoint.progress": "the progress line on stdout",
    "sparkpoint.progress.interval": "how often the progress line is printed",
    "metrics.prometheus.port": "also serve /metrics on this port (at metrics.prometheus.bind-address)",
    "alarms.webhook-url": "checkpoint-failure alarms are POSTed here as JSON",
    "sparkpoint.lease.ttl": "a run that stopped renewing its lease for this long is taken over",
}


def render() -> str:
    durations, comments = _duration_fields(), _comments()
    rows = []
    for name, f in sorted(Settings.model_fields.items(), key=lambda kv: kv[1].alias or kv[0]):
        default = f.default if f.default_factory is None else f.default_factory()
        if name in durations and isinstance(default, int):
            shown = f"`{_duration(default)}`"
        elif name in _memory_fields():
            shown = f"`{default >> 20} mb`"
        else:
            shown = "" if default is None else f"`{default!r}`".replace("|", "\\|")
        what = (comments.get(name) or DESCRIPTIONS.get(f.alias, "")).replace("|", "\\|")
        rows.append(f"| `{f.alias}` | {shown} | {_kind(name, f.annotation, durations)} | {what} |")
    return HEADER + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(REPO)} is out of date: run python scripts/gen_config_keys.py")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
