"""Why a checkpoint did not complete: one typed reason per failure path.

Each reason carries four decisions (the table in docs/failure-reasons.md is the
same list, with what a person should do; a unit test keeps the two in sync):

- ``preflight``: the checkpoint was refused before it was started (no participant
  was asked to snapshot).
- ``counted``: it counts toward ``execution.checkpointing.tolerable-failed-checkpoints``.
  Only failures that say something is wrong with storage or with a participant's
  snapshot count; "not now" answers, shutdowns and superseded attempts never do
  (seed 002: a job whose tasks are still restoring must not fail for it).
- ``fatal``: the job must stop and must NOT be restarted by the restart strategy
  (another run owns the checkpoint namespace: fencing, seed 003).
- ``message`` / ``action``: what happened, and what a person should do about it;
  both go into the log line.
"""

from __future__ import annotations

from enum import Enum


class CheckpointFailureReason(Enum):
    preflight: bool
    counted: bool
    fatal: bool
    message: str
    action: str

    def __new__(cls, preflight: bool, counted: bool, fatal: bool, message: str, action: str):
        member = object.__new__(cls)
        # The message is unique per member, so no two members alias each other.
        member._value_ = message
        member.preflight = preflight
        member.counted = counted
        member.fatal = fatal
        member.message = message
        member.action = action
        return member

    # -- refused before starting: "not now" ------------------------------------------
    COORDINATOR_SHUTDOWN = (
        False, False, False,
        "the checkpoint coordinator is shut down",
        "nothing; expected while the job stops",
    )
    COORDINATOR_SUSPENDING = (
        False, False, False,
        "the checkpoint scheduler was stopped because the job left RUNNING",
        "nothing for the checkpoint; look at why the job left RUNNING (failover, cancel); "
        "checkpoints start again when it is RUNNING again",
    )
    PERIODIC_SCHEDULER_SHUTDOWN = (
        True, False, False,
        "a periodic trigger fired after periodic checkpointing was stopped",
        "nothing; a timer raced with stopping the scheduler",
    )
    ALREADY_QUEUED = (
        True, False, False,
        "a checkpoint request is already queued behind the running ones",
        "nothing; the queued request runs when a running checkpoint finishes",
    )
    TOO_MANY_CONCURRENT = (
        True, False, False,
        "the maximum number of concurrent checkpoints is in progress",
        "nothing if rare; if constant, checkpoints take longer than the interval: "
        "raise execution.checkpointing.interval or make snapshots smaller",
    )
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = (
        True, False, False,
        "the minimum pause since the last completed checkpoint has not passed",
        "nothing; the trigger is rescheduled for when the pause ends",
    )
    NOT_ALL_REQUIRED_TASKS_RUNNING = (
        True, False, False,
        "some participants are not running yet (scheduled or restoring)",
        "nothing while the job starts; if it lasts, look at why those participants "
        "do not reach RUNNING (restore errors, missing executors)",
    )
    ID_COLLISION = (
        True, False, False,
        "every checkpoint id tried already has a directory in checkpoint storage",
        "check that no other deployment writes into this job's checkpoint directory; "
        "the next trigger continues with higher ids",
    )
    # -- coordinator storage --------------------------------------------------------
    IO_EXCEPTION = (
        True, True, False,
        "checkpoint storage failed while starting the checkpoint (id counter or directory)",
        "check that checkpoint storage is reachable and writable (an error that is not a "
        "StorageError is logged with its traceback: a bug in the storage implementation); "
        "the job keeps running until tolerable-failed-checkpoints consecutive failures",
    )
    TRIGGER_FAILED = (
        False, True, False,
        "the runtime could not start the checkpoint (deliver the barrier, or say which "
        "participants run)",
        "look at the runtime error logged with it; if it repeats, no checkpoint can "
        "complete, which is why it counts",
    )
    # -- declined by a participant --------------------------------------------------
    TASK_NOT_READY = (
        False, False, False,
        "a participant is not running yet (still restoring) and cannot snapshot",
        "nothing while it restores; if it lasts, look at that participant's restore",
    )
    TASK_CLOSING = (
        False, False, False,
        "a participant is finishing or being cancelled and cannot snapshot",
        "nothing; expected when a source reaches its end or the job is cancelled",
    )
    TASK_FAILURE = (
        False, False, False,
        "a participant failed (not its snapshot); the job fails over for that failure",
        "look at the participant's failure; the checkpoint itself is not the problem",
    )
    TASK_SYNC_FAILURE = (
        False, True, False,
        "a participant's synchronous snapshot part failed (freeze, local checkpoint, pre-commit)",
        "look at the participant's error (disk full, local state directory); "
        "the job keeps running, only this checkpoint failed",
    )
    TASK_ASYNC_FAILURE = (
        False, True, False,
        "a participant's asynchronous snapshot part failed (upload to checkpoint storage)",
        "check checkpoint storage health (HDFS datanodes, object store errors, a full disk); "
        "the job keeps running, only this checkpoint failed",
    )
    DECLINED_BY_TASK = (
        False, True, False,
        "a participant declined the checkpoint",
        "look at the participant's error logged with it",
    )
    EXPIRED = (
        False, True, False,
        "the checkpoint did not complete within execution.checkpointing.timeout",
        "find the participants that did not acknowledge (logged); if the log says the "
        "trigger was still waiting for checkpoint storage, storage hangs: check it; if "
        "snapshots are just slow, raise execution.checkpointing.timeout (the message shows its "
        "value; a bare number is milliseconds: write '10 min', not 600)",
    )
    # -- completing -----------------------------------------------------------------
    FINALIZE_FAILED = (
        False, True, False,
        "writing the checkpoint's _metadata failed",
        "check checkpoint storage; if _metadata already existed, another writer uses "
        "this directory (the lease should prevent that: check for a second deployment)",
    )
    SUBSUMED = (
        False, False, False,
        "a newer checkpoint completed first and made this one unnecessary",
        "nothing",
    )
    LEASE_LOST = (
        False, False, True,
        "this run lost its lease on the job's checkpoint directory: a newer run took over",
        "this run stops and is not restarted; make sure only one deployment of the job runs",
    )

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}>"

    def __str__(self) -> str:
        return self.name


class RestoreRefusal(Enum):
    """Why a job refused to start from its checkpoints (or a savepoint): the run stops
    before any epoch, so nothing is lost, and the restart strategy does not retry it
    (the same checkpoints would be refused again). Counted per reason in
    ``sparkpoint_restore_refusals_total``; the error's own line says what to do."""

    message: str

    def __new__(cls, message: str) -> "RestoreRefusal":
        member = object.__new__(cls)
        member._value_ = len(cls.__members__)
        member.message = message
        return member

    INCOMPATIBLE_STATE_SCHEMA = "a step declares its state so that the checkpoint's state cannot be read"
    NO_VALID_CHECKPOINT = "none of the job's completed checkpoints (or the savepoint given) restores"
    UNREPLAYABLE_PUBLISHED_EPOCHS = "the sink published epochs that the sources cannot replay identically"
    OUTPUT_WITHOUT_CHECKPOINT = "the sink output holds committed epochs but the job has no checkpoint"
    UNCLAIMED_STATE = "the checkpoint holds the state of a step the pipeline no longer has"
    CHANGED_MAX_PARALLELISM = "the checkpoint was taken with another pipeline.max-parallelism"

    def __str__(self) -> str:
        return self.name
