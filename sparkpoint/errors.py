"""Exceptions. One root; a docstring only where an operator must act.

Packages may add their own modules of exceptions, but every class derives from
`SparkpointError` so callers can catch one type."""


class SparkpointError(Exception):
    pass


class ConfigError(SparkpointError):
    """A configuration key or value is wrong. The message names the key, the bad
    value, and what is accepted."""


class StorageError(SparkpointError):
    """Checkpoint storage failed an operation (I/O error, permission, timeout)."""


class CheckpointIdCollision(StorageError):
    pass


class MetadataExistsError(StorageError):
    pass


class LeaseHeldError(SparkpointError):
    """Another run holds this job's lease. The message says who and since when: stop
    that run (`sparkpoint stop`), or start with a different job name. A crashed holder's
    lease expires by itself; one on this host whose process is gone is taken over at once."""


class LeaseLostError(StorageError):
    """This run was fenced out by a newer run of the same job; it must stop."""


class LeaseLapsedError(StorageError):
    """This run could not renew its lease for most of its ttl: commits pause until a
    heartbeat reaches storage again (not fatal; a proven takeover is LeaseLostError)."""


class CorruptCheckpointError(SparkpointError):
    """A checkpoint's metadata or files fail verification."""


class NoValidCheckpointError(SparkpointError):
    """Checkpoints exist for this job but none verifies. Nothing is started, so nothing
    is lost. Inspect with `sparkpoint doctor DIR`; to start from empty state anyway,
    pass `--set restore.mode=empty` (this replays sources from their start positions)."""


class EpochPlanError(SparkpointError):
    """An entry of the epoch plan log (`<job>/plans/`) is missing, damaged or of another
    line of epochs; the message names the file."""


class PublishedEpochsNotReplayableError(NoValidCheckpointError):
    """The sink already published epochs after the checkpoint being restored, and the
    epoch plan log cannot replay them as first planned: restoring would publish them a
    second time. Nothing was started. The message names the epochs, the entry and the
    setting that accepts publishing them again (`restore.unreplayable-epochs=publish-again`)."""


class ForeignCheckpointError(SparkpointError):
    """The checkpoint directory was written by something else (another program or an
    unknown format version). Point `execution.checkpointing.dir` somewhere else."""


class StaleStateError(SparkpointError):
    """A subtask's local state is not at the version the job expects."""


class LocalStateHeldError(SparkpointError):
    """Another Python worker of the executor still has a subtask's local store open
    (a task of an earlier attempt still running): the task fails rather than open or
    replace it, and Spark or the job's restart runs it again."""


class JobFailedError(SparkpointError):
    pass


class MetadataEncodeError(StorageError):
    """A checkpoint's handles are not JSON-compatible, so `_metadata` cannot be written.
    The participant named in the message must return plain dicts/lists/str/int/float/bool/None."""


class CorruptSnapshotError(CorruptCheckpointError):
    """State files of a checkpoint are missing or fail their size/sha256 check. The
    message names the files and the checkpoint; restore from an older retained
    checkpoint (`sparkpoint checkpoints verify` lists which ones verify)."""

    def __init__(self, message: str, problems: tuple = ()):
        super().__init__(message)
        self.problems = problems


class SnapshotCancelled(SparkpointError):
    """A state upload stopped because its checkpoint was aborted; nothing more is
    written for it. Not a failure of the job."""


class StateSchemaError(SparkpointError):
    """A state value or an operator's output does not match its declared schema. The
    message names the state (or processor) and the field; fix the declared schema or
    the value written."""


class IncompatibleStateSchemaError(ConfigError):
    """The state a checkpoint holds was declared in a way the pipeline's processor can
    no longer read (a dropped or retyped field, a state that changed kind). Raised at
    restore, before anything runs; the message names the step, the state, the field
    and what to do."""


class KafkaConnectorError(SparkpointError):
    """A Kafka source or sink could not do its job (broker unreachable past the
    timeout, topic missing, data removed by retention). The message names the topic
    and what to check."""


class UnsupportedPySpark(SparkpointError, ImportError):
    """`import sparkpoint` found no PySpark, or one outside the supported range. Install
    `sparkpoint[spark]`, or run on a Spark runtime whose pyspark is in the range."""
