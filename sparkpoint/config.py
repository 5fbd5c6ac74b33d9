"""Job configuration with Flink's key names where they exist.

Settable four ways, later ones winning: a YAML file (flat dotted keys, or nested
maps that flatten to them), environment variables (`SPARKPOINT_` + the key in capitals
with `.` and `-` as `_`: `SPARKPOINT_EXECUTION_CHECKPOINTING_DIR`; see `env_name`),
`--set key=value` on the command line, and keyword overrides from Python
(`Settings.load(overrides={"execution.checkpointing.interval": "1 s"})`).
`spark.conf` merges over the layers instead of being replaced, and one Spark setting
can be given as `spark.conf.<spark key>` (`--set spark.conf.spark.executor.memory=4g`).
An unknown key or a bad value is one `ConfigError` naming the key, the value and
what is accepted.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from sparkpoint.errors import ConfigError

log = logging.getLogger(__name__)

SPARK_CONF = "spark.conf"
_SPARK_CONF_PREFIX = SPARK_CONF + "."
ENV_PREFIX = "SPARKPOINT_"
# SPARKPOINT_ variables that are not configuration keys: the CLI's own and the runtime
# directory of the control token (sparkpoint/runtime/rest/security.py).
_ENV_NOT_KEYS = {"SPARKPOINT_LOG_LEVEL", "SPARKPOINT_REST_ADDRESS", "SPARKPOINT_RUNTIME_DIR"}

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_UNITS_MS = {
    "": 1, "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "min": 60_000, "m": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
}


def parse_duration_ms(value: Any) -> int:
    """Flink-style durations: 500 (ms), "500 ms", "2 s", "1 min", "1h"."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '2 s' or '500 ms'")
    if isinstance(value, (int, float)):
        return int(value)
    m = _DURATION_RE.match(str(value))
    if not m or m.group(2).lower() not in _UNITS_MS:
        raise ValueError(f"{value!r} is not a duration; use e.g. '2 s', '500 ms', '1 min'")
    return int(float(m.group(1)) * _UNITS_MS[m.group(2).lower()])


_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_UNITS_BYTES = {
    "": 1, "b": 1, "bytes": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "kibibytes": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20, "mebibytes": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "gibibytes": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40, "tebibytes": 1 << 40,
}


def parse_memory_bytes(value: Any) -> int:
    """Flink-style memory sizes: 268435456 (bytes), "256 mb", "1g" (units of 1024)."""
    if isinstance(value, bool):
        raise ValueError("expected a memory size such as '256 mb' or '1 gb'")
    if isinstance(value, (int, float)):
        return int(value)
    m = _MEMORY_RE.match(str(value))
    if not m or m.group(2).lower() not in _UNITS_BYTES:
        raise ValueError(f"{value!r} is not a memory size; use e.g. '256 mb', '1 gb'")
    return int(float(m.group(1)) * _UNITS_BYTES[m.group(2).lower()])


# Duration keys where a bare number below the threshold (ms) is almost surely seconds
# written without a unit: Flink reads bare numbers as ms, so `timeout: 30` is 30 ms and
# every checkpoint expires. Short restart delays and pauses are plausible; not listed.
_IMPLAUSIBLE_BARE_MS = {
    "execution.checkpointing.interval": 100,
    "execution.checkpointing.timeout": 100,
    "sparkpoint.lease.ttl": 100,
    "state.changelog.periodic-materialize.interval": 100,
    "restart-strategy.failure-rate.failure-rate-interval": 100,
    "restart-strategy.exponential-delay.reset-backoff-threshold": 100,
    "sparkpoint.progress.interval": 100,
    "sparkpoint.epoch.target-duration": 50,
    "sparkpoint.epoch.max-duration": 50,
}
_BARE_NUMBER_RE = re.compile(r"^\s*\d+(?:\.\d+)?\s*$")


def _bare_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or (isinstance(value, str) and bool(_BARE_NUMBER_RE.match(value)))


def unit_warnings(raw: Mapping[str, Any]) -> list[str]:
    """One line per duration key given as a bare number that is implausibly small."""
    out = []
    for key, threshold in _IMPLAUSIBLE_BARE_MS.items():
        value = raw.get(key)
        if value is None or not _bare_number(value):
            continue
        ms = parse_duration_ms(value)
        if 0 < ms < threshold:
            shown = str(value).strip()
            out.append(f"{key}={shown} is {ms} ms: a bare number is milliseconds (Flink's rule). "
                       f"If you meant seconds, write '{shown} s' (e.g. {key}: {shown} s)")
    return out


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Settings(_Model):
    job_name: str = Field("sparkpoint-job", alias="pipeline.name")

    # -- checkpointing (Flink's execution.checkpointing.*) --------------------------
    checkpoint_dir: str = Field("./checkpoints", alias="execution.checkpointing.dir")
    checkpoint_interval_ms: int = Field(2_000, alias="execution.checkpointing.interval")
    checkpoint_min_pause_ms: int = Field(0, alias="execution.checkpointing.min-pause")
    checkpoint_timeout_ms: int = Field(60_000, alias="execution.checkpointing.timeout")
    checkpoint_max_concurrent: int = Field(1, alias="execution.checkpointing.max-concurrent-checkpoints")
    # Flink defaults to 0, which turns one storage hiccup into a job restart (seed 001).
    # 10 rides out a ~20 s outage at a 2 s interval while still surfacing a dead store.
    tolerable_failed_checkpoints: int = Field(10, alias="execution.checkpointing.tolerable-failed-checkpoints")
    num_retained: int = Field(3, alias="execution.checkpointing.num-retained")
    # A completed checkpoint whose commit (publishing its sink output) fails is published by
    # the next checkpoint's commit. After more failed commits in a row than this, the job
    # fails over, so a sink that can no longer publish shows as a failover and not as a
    # RUNNING job whose output stopped; recovery publishes what the restored checkpoint staged.
    tolerable_failed_commits: int = Field(5, alias="sparkpoint.sink.tolerable-failed-commits")
    checkpointing_enabled: bool = Field(True, alias="execution.checkpointing.enabled")
    storage_options: dict[str, Any] = Field(default_factory=dict, alias="execution.checkpointing.storage-options")
    # Where savepoints may be written besides below execution.checkpointing.dir, whoever
    # asks (the REST API, the CLI, or Python: job.trigger_savepoint, job.stop): paths or
    # URLs (s3://bucket/savepoints); a target must lie below one of them. Anything else is
    # refused, so a request cannot send the job's state to a server or to another disk.
    savepoint_allowed_targets: list[str] = Field(default_factory=list,
                                                 alias="execution.checkpointing.savepoint.allowed-targets")

    # -- parallelism / key groups ----------------------------------------------------
    parallelism: int = Field(2, alias="parallelism.default")
    max_parallelism: int = Field(128, alias="pipeline.max-parallelism")

    # -- restart strategy (Flink's restart-strategy.*) -------------------------------
    restart_strategy: Literal["fixed-delay", "exponential-delay", "failure-rate", "none"] = Field(
        "exponential-delay", alias="restart-strategy.type")
    fixed_delay_attempts: int = Field(2_147_483_647, alias="restart-strategy.fixed-delay.attempts")
    fixed_delay_ms: int = Field(1_000, alias="restart-strategy.fixed-delay.delay")
    exp_initial_backoff_ms: int = Field(1_000, alias="restart-strategy.exponential-delay.initial-backoff")
    exp_max_backoff_ms: int = Field(60_000, alias="restart-strategy.exponential-delay.max-backoff")
    exp_multiplier: float = Field(2.0, alias="restart-strategy.exponential-delay.backoff-multiplier")
    exp_reset_threshold_ms: int = Field(3_600_000, alias="restart-strategy.exponential-delay.reset-backoff-threshold")
    exp_jitter: float = Field(0.1, alias="restart-strategy.exponential-delay.jitter-factor")
    exp_attempts: int = Field(2_147_483_647, alias="restart-strategy.exponential-delay.attempts-before-reset-backoff")
    failure_rate_max: int = Field(1, alias="restart-strategy.failure-rate.max-failures-per-interval")
    failure_rate_interval_ms: int = Field(60_000, alias="restart-strategy.failure-rate.failure-rate-interval")
    failure_rate_delay_ms: int = Field(1_000, alias="restart-strategy.failure-rate.delay")
    # On top of the strategy: a failure that recurs identically after restoring the same
    # checkpoint (user code raising on the same input) cannot go away by restarting; the
    # job stops after this many such attempts. 0: only the strategy decides.
    same_failure_max_attempts: int = Field(3, alias="restart-strategy.same-failure.max-attempts")

    # -- state -----------------------------------------------------------------------
    local_state_dir: str = Field("./state", alias="state.local.dir")
    # Durable state = a periodic snapshot + per-epoch change logs (sparkpoint/state/changelog.py):
    # how often each subtask uploads a snapshot (Flink's key), and at most how many change
    # logs a rebuild replays before one is forced.
    materialize_interval_ms: int = Field(10_000, alias="state.changelog.periodic-materialize.interval")
    materialize_max_changelogs: int = Field(50, alias="state.changelog.max-changelogs")
    restore_mode: Literal["latest", "empty"] = Field("latest", alias="restore.mode")
    # A sink that cannot withdraw published output (Kafka) may have published epochs past
    # the checkpoint a restore falls back to; they are replayed from the epoch plan log as
    # first planned and not published again. If the log cannot replay them: `fail` stops
    # with one line; `publish-again` plans them anew and publishes them a second time.
    unreplayable_epochs: Literal["fail", "publish-again"] = Field("fail", alias="restore.unreplayable-epochs")
    # A savepoint (or a retained checkpoint directory) to start from (Flink's keys). Once
    # the job has checkpoints of its own taken after it, those win: a rerun after a crash
    # resumes where it was, not at the savepoint again. NO_CLAIM: the job never deletes
    # or references the savepoint's files (it copies what it needs into its own storage).
    recovery_path: str | None = Field(None, alias="execution.state-recovery.path")
    recovery_claim_mode: Literal["NO_CLAIM"] = Field("NO_CLAIM", alias="execution.state-recovery.claim-mode")
    # A stateful step whose state is in the restored checkpoint or savepoint but that the
    # pipeline no longer has (renamed or removed: a step's name is its state's identity)
    # stops the job before anything runs; true drops that state and starts without it
    # (Flink's allowNonRestoredState; `sparkpoint run --allow-non-restored-state`).
    ignore_unclaimed_state: bool = Field(False, alias="execution.savepoint.ignore-unclaimed-state")
    lease_ttl_ms: int = Field(15_000, alias="sparkpoint.lease.ttl")

    # -- state memory per Spark Python worker (Flink's state.backend.rocksdb.memory.*) --
    # Bound the state memory of each Spark Python worker (outside Spark's accounting) by
    # one shared block cache, write-buffer manager and read-cache budget; false: each
    # store unbounded (2 x 32 MB memtables, a read cache of up to 1M entries).
    rocksdb_memory_managed: bool = Field(True, alias="state.backend.rocksdb.memory.managed")
    # The state memory of one Spark Python worker (one task slot): RocksDB's block cache
    # and memtables and sparkpoint's read cache of every store it keeps open, together.
    # An executor needs this times its task slots (docs/memory.md).
    rocksdb_memory_per_slot: int = Field(256 << 20, alias="state.backend.rocksdb.memory.fixed-per-slot")
    # The share of RocksDB's memory (after the read cache) that memtables may take (Flink's key).
    rocksdb_write_buffer_ratio: float = Field(0.5, alias="state.backend.rocksdb.memory.write-buffer-ratio")
    # The share of fixed-per-slot for committed values sparkpoint keeps in Python (read
    # cache, shared by the worker's stores); 0 turns the read cache off.
    rocksdb_read_cache_ratio: float = Field(0.25, alias="state.backend.rocksdb.memory.read-cache-ratio")
    # Subtask stores one worker keeps open between epochs at most (the least recently used
    # is closed); 0 closes every store after its task.
    rocksdb_kept_stores: int = Field(8, alias="state.backend.rocksdb.memory.kept-stores")

    @field_validator("rocksdb_memory_per_slot", mode="before")
    @classmethod
    def _memory_size(cls, v: Any) -> int:
        v = parse_memory_bytes(v)
        if v < 16 << 20:
            raise ValueError("must be at least 16 mb (RocksDB needs a few MB per open store)")
        return v

    @field_validator("rocksdb_write_buffer_ratio")
    @classmethod
    def _open_ratio(cls, v: float) -> float:
        if not 0 < v < 1:
            raise ValueError("must be between 0 and 1 (exclusive)")
        return v

    @field_validator("rocksdb_read_cache_ratio")
    @classmethod
    def _ratio(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError("must be at least 0 and less than 1")
        return v

    @field_validator("rocksdb_kept_stores")
    @classmethod
    def _kept_stores(cls, v: int) -> int:
        if v < 0:
            raise ValueError("must be 0 or more")
        return v

    # -- metrics -----------------------------------------------------------------------
    # The address metrics.prometheus.port binds to: loopback unless set (e.g. 0.0.0.0 for a
    # Prometheus on another machine). /metrics needs no token: it holds no secrets.
    metrics_bind_address: str = Field("127.0.0.1", alias="metrics.prometheus.bind-address")

    @model_validator(mode="after")
    def _metrics_address_needs_a_port(self) -> "Settings":
        if self.metrics_port is None and not _is_loopback(self.metrics_bind_address):
            raise ConfigError(f"metrics.prometheus.bind-address={self.metrics_bind_address} needs "
                              "metrics.prometheus.port too (the port Prometheus scrapes /metrics on)")
        return self
    # -- end of state memory and metrics ------------------------------------------------

    # -- runtime -------------------------------------------------------------------
    # Any master Spark accepts: `local[N]`, `spark://host:port`, `yarn`, `k8s://...`. Unset: the
    # master spark-submit was given, else `local[2]`. Ignored for a session handed to the job
    # (pipeline.run(spark=...), or the active session), which keeps its own master.
    spark_master: str | None = Field(None, alias="spark.master")
    # Spark settings for a session sparkpoint creates, over its own (docs/deploy.md, "What
    # sparkpoint sets in Spark"); one key at a time with `spark.conf.<spark key>=value`. Values
    # may be YAML numbers and booleans. A session handed to the job keeps its settings.
    # A Spark Connect server to run on instead (sc://HOST:PORT); Spark's SPARK_REMOTE too.
    spark_remote: str | None = Field(None, alias="spark.remote")
    spark_conf: dict[str, str] = Field(default_factory=dict, alias="spark.conf")
    # On a cluster master, how long the job waits at start for a first executor to register
    # with its driver before it stops with a line saying what to check (usually a driver
    # address the executors cannot reach). 0: no wait. Skipped under dynamic allocation.
    executor_registration_timeout_ms: int = Field(120_000, alias="sparkpoint.executor-registration.timeout")
    idle_pause_ms: int = Field(200, alias="sparkpoint.idle-pause")
    # Epochs sized by time (runtime/epoch_sizer.py): the sources' slices are cut until an
    # epoch takes about this long. A checkpoint completes at the end of the epoch its
    # trigger falls in, so this bounds checkpoint duration and output latency, at the cost
    # of more per-epoch overhead. 0: epochs are bounded by the sources' own limits only.
    epoch_target_ms: int = Field(0, alias="sparkpoint.epoch.target-duration")
    # Without a target: once an epoch takes longer than this, the next ones are cut to half
    # of it (runtime/epoch_sizer.py). A checkpoint spans at most two epochs, so the default,
    # a quarter of execution.checkpointing.timeout, keeps a slow step from making checkpoints
    # expire. Unset: that quarter. 0: epochs are never cut.
    epoch_max_ms: int | None = Field(None, alias="sparkpoint.epoch.max-duration")
    progress: bool = Field(True, alias="sparkpoint.progress")
    progress_interval_ms: int = Field(1_000, alias="sparkpoint.progress.interval")
    metrics_port: int | None = Field(None, alias="metrics.prometheus.port")
    # The job's REST API, dashboard and /metrics (docs/operations.md). Flink's port; 0 = any
    # free port. The address taken is recorded in the job's lease, where the CLI finds it.
    rest_enabled: bool = Field(True, alias="rest.enabled")
    rest_port: int = Field(8081, alias="rest.port")
    rest_bind_address: str = Field("127.0.0.1", alias="rest.bind-address")
    # Required when rest.bind-address is not a loopback address: anyone who can reach the
    # port could otherwise stop the job. When set, every request must carry it
    # (Authorization: Bearer); control requests also accept the job's generated control
    # token (docs/operations.md, "Who may steer the job").
    rest_token: str | None = Field(None, alias="rest.token")
    alarm_webhook: str | None = Field(None, alias="alarms.webhook-url")
    # Failure rehearsal: rules for sparkpoint.faults (see docs/faults.md).
    faults: list[dict[str, Any]] = Field(default_factory=list, alias="sparkpoint.faults")
    _unit_warnings: list[str] = PrivateAttr(default_factory=list)

    @property
    def epoch_ceiling_ms(self) -> int:
        """How long an epoch may take before the next ones are cut (0: never cut)."""
        return self.checkpoint_timeout_ms // 4 if self.epoch_max_ms is None else self.epoch_max_ms

    @property
    def unit_warnings(self) -> list[str]:
        """Bare numbers for durations that are implausibly small (logged at job start)."""
        return list(self._unit_warnings)

    @field_validator(
        "checkpoint_interval_ms", "checkpoint_min_pause_ms", "checkpoint_timeout_ms", "fixed_delay_ms",
        "exp_initial_backoff_ms", "exp_max_backoff_ms", "exp_reset_threshold_ms", "failure_rate_interval_ms",
        "failure_rate_delay_ms", "lease_ttl_ms", "idle_pause_ms", "progress_interval_ms",
        "materialize_interval_ms", "epoch_target_ms", "epoch_max_ms", "executor_registration_timeout_ms",
        mode="before")
    @classmethod
    def _duration(cls, v: Any) -> int | None:
        return None if v is None else parse_duration_ms(v)

    @field_validator("checkpoint_interval_ms", "checkpoint_timeout_ms", "parallelism", "max_parallelism",
                     "checkpoint_max_concurrent", "num_retained", "materialize_max_changelogs")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("must be greater than 0")
        return v

    @field_validator("rest_port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 0 <= v <= 65535:
            raise ValueError("must be a TCP port (0 = any free port)")
        return v

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _spark_conf(cls, v: Any) -> Any:
        """Spark's conf is strings; YAML gives numbers and booleans (`spark.executor.instances: 4`),
        and nested maps (`spark: {executor: {memory: 4g}}`) stand for dotted keys."""
        if not isinstance(v, Mapping):
            return v
        flat: dict[str, Any] = {}
        _flatten("", v, flat, set())
        out = {}
        for key, value in flat.items():
            if isinstance(value, bool):
                out[key] = "true" if value else "false"
            elif isinstance(value, (int, float, str)):
                out[key] = str(value)
            else:
                raise ValueError(f"{key}: Spark settings are single values (a string, number or true/false), "
                                 f"not {type(value).__name__}")
        return out

    @field_validator("tolerable_failed_checkpoints", "tolerable_failed_commits", "checkpoint_min_pause_ms",
                     "same_failure_max_attempts", "epoch_target_ms", "epoch_max_ms", "executor_registration_timeout_ms")
    @classmethod
    def _non_negative(cls, v: int | None) -> int | None:
        if v is not None and v < 0:
            raise ValueError("must be 0 or more")
        return v

    def model_post_init(self, __context: Any) -> None:
        if self.parallelism > self.max_parallelism:
            raise ConfigError(
                f"parallelism.default={self.parallelism} exceeds pipeline.max-parallelism="
                f"{self.max_parallelism}: each subtask needs at least one key group; raise "
                f"pipeline.max-parallelism or lower parallelism.default")
        if self.rest_enabled and not self.rest_token and not _is_loopback(self.rest_bind_address):
            raise ConfigError(
                f"rest.bind-address={self.rest_bind_address} is reachable from other machines: set "
                f"rest.token too (clients send it as 'Authorization: Bearer <token>'), or bind 127.0.0.1")

    # -------------------------------------------------------------------------------
    @classmethod
    def keys(cls) -> list[str]:
        return sorted(f.alias for f in cls.model_fields.values() if f.alias)

    @classmethod
    def env_name(cls, key: str) -> str:
        """The environment variable of a key: `SPARKPOINT_` + the key in capitals, `.` and `-`
        as `_` (`rest.bind-address` -> `SPARKPOINT_REST_BIND_ADDRESS`). Values are read as in
        `--set` (YAML: `4`, `true`, `{a: b}`)."""
        return ENV_PREFIX + re.sub(r"[.-]", "_", key).upper()

    @classmethod
    def load(cls, file: str | Path | None = None, sets: list[str] | None = None,
             overrides: Mapping[str, Any] | None = None, base: Mapping[str, Any] | None = None,
             environ: Mapping[str, str] | None = None) -> "Settings":
        """`environ` defaults to the process environment."""
        raw: dict[str, Any] = {}
        _merge(raw, base or {})
        if file is not None:
            _merge(raw, _read_yaml(Path(file)))
        _merge(raw, cls._from_environment(os.environ if environ is None else environ))
        for item in sets or []:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set execution.checkpointing.interval=2s")
            _merge(raw, {key.strip(): yaml.safe_load(value) if value.strip() else ""})
        _merge(raw, overrides or {})
        return cls.from_mapping(raw)

    @classmethod
    def _from_environment(cls, environ: Mapping[str, str]) -> dict[str, Any]:
        by_env = {cls.env_name(k): k for k in cls.keys()}
        out: dict[str, Any] = {}
        for name, value in environ.items():
            if not name.startswith(ENV_PREFIX) or name in _ENV_NOT_KEYS:
                continue
            key = by_env.get(name)
            if key is None:
                hint = difflib.get_close_matches(name, sorted(by_env), n=1, cutoff=0.85)
                if hint:  # other SPARKPOINT_ variables exist (tools, tests): only a near miss is flagged
                    log.warning("environment variable %s is not a configuration key; did you mean %s (%s)?",
                                name, hint[0], by_env[hint[0]])
                continue
            try:
                out[key] = yaml.safe_load(value) if value.strip() else ""
            except yaml.YAMLError:
                out[key] = value
        return out

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> "Settings":
        known = set(cls.keys())
        by_name = {name: f.alias for name, f in cls.model_fields.items()}
        data: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        _merge(merged, raw)
        for key, value in merged.items():
            alias = by_name.get(key, key)
            if alias not in known:
                near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.85)
                if key.startswith("spark.") and not key.startswith(_SPARK_CONF_PREFIX) and not near:
                    raise ConfigError(
                        f"unknown configuration key {key!r}: Spark's own settings go under spark.conf; "
                        f"did you mean '{_SPARK_CONF_PREFIX}{key}'? (e.g. --set {_SPARK_CONF_PREFIX}{key}=...)")
                hint = difflib.get_close_matches(key, sorted(known), n=1)
                raise ConfigError(
                    f"unknown configuration key {key!r}"
                    + (f"; did you mean {hint[0]!r}?" if hint else "")
                    + " (run `sparkpoint config-keys` for the list)")
            data[alias] = value
        try:
            settings = cls.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            loc = err["loc"][0] if err["loc"] else "?"
            alias = by_name.get(str(loc), str(loc))
            bad = data.get(alias, "<missing>")
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise ConfigError(f"bad value for {alias}: {bad!r}: {msg}") from None
        settings._unit_warnings = unit_warnings(data)
        return settings


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _merge(raw: dict[str, Any], layer: Mapping[str, Any]) -> None:
    """Lay `layer` over `raw`: keys replace, except that Spark settings (`spark.conf` maps and
    `spark.conf.<spark key>` entries) add to the ones already there."""
    for key, value in layer.items():
        name = "spark.conf" if key == "spark_conf" else key
        if name == SPARK_CONF and isinstance(value, Mapping):
            raw[SPARK_CONF] = {**_as_map(raw.get(SPARK_CONF)), **value}
        elif name.startswith(_SPARK_CONF_PREFIX) and len(name) > len(_SPARK_CONF_PREFIX):
            raw[SPARK_CONF] = {**_as_map(raw.get(SPARK_CONF)), name[len(_SPARK_CONF_PREFIX):]: value}
        else:
            raw[name if name == SPARK_CONF else key] = value


def _as_map(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _flatten(prefix: str, value: Any, out: dict[str, Any], dict_keys: set[str]) -> None:
    if isinstance(value, Mapping) and prefix not in dict_keys:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out, dict_keys)
    else:
        out[prefix] = value


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"config file {path} must be a mapping of keys to values")
    # Keys whose values are maps themselves stay whole.
    dict_keys = {"spark.conf", "execution.checkpointing.storage-options"}
    out: dict[str, Any] = {}
    _flatten("", doc, out, dict_keys)
    return out
