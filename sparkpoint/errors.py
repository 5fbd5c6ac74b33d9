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
    """Another run holds this job's lease. The message says who and since when; stop
    that run, or wait for the lease to expire, or start with a different job name."""


class LeaseLostError(StorageError):
    """This run was fenced out by a newer run of the same job; it must stop."""


class CorruptCheckpointError(SparkpointError):
    """A checkpoint's metadata or files fail verification."""


class NoValidCheckpointError(SparkpointError):
    """Checkpoints exist for this job but none verifies. Nothing is started, so nothing
    is lost. Inspect with `sparkpoint doctor DIR`; to start from empty state anyway,
    pass `--set restore.mode=empty` (this replays sources from their start positions)."""


class ForeignCheckpointError(SparkpointError):
    """The checkpoint directory was written by something else (another program or an
    unknown format version). Point `execution.checkpointing.dir` somewhere else."""


class StaleStateError(SparkpointError):
    """A subtask's local state is not at the version the job expects."""


class JobFailedError(SparkpointError):
    pass
