"""Checkpoint coordination: a clock, messages, and typed outcomes. No Spark, no filesystem."""

from sparkpoint.checkpoint.alarms import (
    AlarmBus,
    AlarmListener,
    CheckpointFailureEvent,
    WebhookAlarmListener,
)
from sparkpoint.checkpoint.completed_store import CompletedCheckpointStore
from sparkpoint.checkpoint.config import (
    DEFAULT_TOLERABLE_FAILED_CHECKPOINTS,
    CheckpointCoordinatorConfig,
)
from sparkpoint.checkpoint.coordinator import CheckpointCoordinator
from sparkpoint.checkpoint.exceptions import (
    CheckpointFailedError,
    CheckpointsStillFinalizingError,
    CoordinatorShutDownError,
    TolerableCheckpointFailuresExceeded,
)
from sparkpoint.checkpoint.failure_manager import (
    CheckpointFailureManager,
    FailureOutcome,
    FailureVerdict,
)
from sparkpoint.checkpoint.interfaces import (
    Cancellable,
    CheckpointIDCounter,
    CheckpointLocation,
    CheckpointProperties,
    CheckpointStorage,
    CompletedCheckpointData,
    ParticipantGateway,
    ParticipantId,
    Scheduler,
    StateHandle,
    SupportsDiscardAborted,
    SupportsHighestCheckpointId,
    SupportsSavepointComplete,
)
from sparkpoint.checkpoint.pending import METRIC_BYTES, AckResult, PendingCheckpoint
from sparkpoint.checkpoint.reasons import CheckpointFailureReason
from sparkpoint.checkpoint.scheduler import ManualScheduler, ScheduledTask, ThreadScheduler
from sparkpoint.checkpoint.stats import CheckpointStatsTracker
from sparkpoint.checkpoint.trigger_decider import TriggerDecision, TriggerState, decide_trigger

__all__ = [
    "AckResult",
    "AlarmBus",
    "AlarmListener",
    "Cancellable",
    "CheckpointCoordinator",
    "CheckpointCoordinatorConfig",
    "CheckpointFailedError",
    "CheckpointFailureEvent",
    "CheckpointFailureManager",
    "CheckpointFailureReason",
    "CheckpointIDCounter",
    "CheckpointLocation",
    "CheckpointProperties",
    "CheckpointStatsTracker",
    "CheckpointStorage",
    "CheckpointsStillFinalizingError",
    "CompletedCheckpointData",
    "CompletedCheckpointStore",
    "CoordinatorShutDownError",
    "DEFAULT_TOLERABLE_FAILED_CHECKPOINTS",
    "FailureOutcome",
    "FailureVerdict",
    "ManualScheduler",
    "METRIC_BYTES",
    "ParticipantGateway",
    "ParticipantId",
    "PendingCheckpoint",
    "ScheduledTask",
    "Scheduler",
    "StateHandle",
    "SupportsDiscardAborted",
    "SupportsHighestCheckpointId",
    "SupportsSavepointComplete",
    "ThreadScheduler",
    "TolerableCheckpointFailuresExceeded",
    "TriggerDecision",
    "TriggerState",
    "WebhookAlarmListener",
    "decide_trigger",
]
