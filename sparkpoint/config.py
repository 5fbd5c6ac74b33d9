"""Job configuration with Flink's key names where they exist.

Settable three ways, later ones winning: a YAML file (flat dotted keys, or nested
maps that flatten to them), `--set key=value` on the command line, and keyword
overrides from Python (`Settings.load(overrides={"execution.checkpointing.interval": "1 s"})`).
An unknown key or a bad value is one `ConfigError` naming the key, the value and
what is accepted.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from sparkpoint.errors import ConfigError

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
    checkpointing_enabled: bool = Field(True, alias="execution.checkpointing.enabled")
    storage_options: dict[str, Any] = Field(default_factory=dict, alias="execution.checkpointing.storage-options")
    # Where savepoints asked for over the REST API (and so the CLI) may be written besides
    # below execution.checkpointing.dir: paths or URLs (s3://bucket/savepoints); a target
    # must lie below one of them. Anything else is refused, so a request cannot send the
    # job's state to a server or to another disk.
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
    lease_ttl_ms: int = Field(15_000, alias="sparkpoint.lease.ttl")

    # -- runtime -------------------------------------------------------------------
    spark_master: str = Field("local[2]", alias="spark.master")
    spark_conf: dict[str, str] = Field(default_factory=dict, alias="spark.conf")
    idle_pause_ms: int = Field(200, alias="sparkpoint.idle-pause")
    # Epochs sized by time (runtime/epoch_sizer.py): the sources' slices are cut until an
    # epoch takes about this long. A checkpoint completes at the end of the epoch its
    # trigger falls in, so this bounds checkpoint duration and output latency, at the cost
    # of more per-epoch overhead. 0: epochs are bounded by the sources' own limits only.
    epoch_target_ms: int = Field(0, alias="sparkpoint.epoch.target-duration")
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
    def unit_warnings(self) -> list[str]:
        """Bare numbers for durations that are implausibly small (logged at job start)."""
        return list(self._unit_warnings)

    @field_validator(
        "checkpoint_interval_ms", "checkpoint_min_pause_ms", "checkpoint_timeout_ms", "fixed_delay_ms",
        "exp_initial_backoff_ms", "exp_max_backoff_ms", "exp_reset_threshold_ms", "failure_rate_interval_ms",
        "failure_rate_delay_ms", "lease_ttl_ms", "idle_pause_ms", "progress_interval_ms",
        "materialize_interval_ms", "epoch_target_ms", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> int:
        return parse_duration_ms(v)

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

    @field_validator("tolerable_failed_checkpoints", "checkpoint_min_pause_ms", "same_failure_max_attempts",
                     "epoch_target_ms")
    @classmethod
    def _non_negative(cls, v: int) -> int:
        if v < 0:
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
    def load(cls, file: str | Path | None = None, sets: list[str] | None = None,
             overrides: Mapping[str, Any] | None = None, base: Mapping[str, Any] | None = None) -> "Settings":
        raw: dict[str, Any] = dict(base or {})
        if file is not None:
            raw.update(_read_yaml(Path(file)))
        for item in sets or []:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set execution.checkpointing.interval=2s")
            raw[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        raw.update(overrides or {})
        return cls.from_mapping(raw)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> "Settings":
        known = set(cls.keys())
        by_name = {name: f.alias for name, f in cls.model_fields.items()}
        data: dict[str, Any] = {}
        for key, value in raw.items():
            alias = by_name.get(key, key)
            if alias not in known:
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
