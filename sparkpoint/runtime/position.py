"""Where the job is: the one object that owns the job's position (no Spark here).

The position is what a checkpoint's `job` part and its `source:<name>` parts hold, and
what a restore brings back:
  - the last epoch that finished;
  - each source's positions after it (`SlicePlan.end` of its slice);
  - the event times (runtime/graph.py `EventTimes`): each watermarked stream's largest
    event time, and the watermark each stateful step last ran under;
  - the savepoint the job's state descends from (`origin`, and where it was).
It also counts the input records, each once per run, and those that epochs re-run
after a restore read again, by the highest epoch this run has run.

The epoch sequence (runtime/jobmaster.py `_run_one_epoch`) asks it for each step's
watermark before an epoch, tells it `advance` once the epoch finished, and at a barrier
asks `to_checkpoint` and `source_handles`. The restorer (runtime/restore.py) calls
`restore` or `start_fresh`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

from sparkpoint.connectors.base import Positions, SlicePlan
from sparkpoint.runtime.graph import EventTimes

log = logging.getLogger("sparkpoint.runtime.jobmaster")


class JobPosition:
    """The job's epoch, source positions, event times and record counts."""

    def __init__(self, source_names: Iterable[str], event_times: EventTimes):
        self.source_names = list(source_names)
        self.event_times = event_times
        self.epoch = -1
        self.source_positions: dict[str, Positions] = {name: {} for name in self.source_names}
        self.records = 0  # input records, each counted once per run
        self.replayed_records = 0  # read again by epochs re-run after a restore
        self.highest_epoch_run = -1
        self.origin: str | None = None  # the savepoint this job's state descends from
        self.origin_path: str | None = None  # ... and where it was (execution.state-recovery.path)

    # -- before an epoch ---------------------------------------------------------------
    @property
    def next_epoch(self) -> int:
        return self.epoch + 1

    def step_watermarks(self, steps: Iterable[str], now_ms: int, final: bool) -> dict[str, int | None]:
        """The watermark each step runs the next epoch under; none in the final epoch (it fires everything)."""
        return {step: None if final else self.event_times.for_step(step, now_ms) for step in steps}

    def watermark(self, now_ms: int) -> int | None:
        """The job's watermark: the minimum over every watermarked stream (idle ones left out)."""
        return self.event_times.job_watermark(now_ms)

    def max_event_time(self) -> int | None:
        """The largest event time any watermarked stream has seen."""
        return self.event_times.overall_max()

    def joined(self) -> dict:
        """Every source's positions in the shape of a joined plan (`join_plans`)."""
        if len(self.source_names) == 1:
            return dict(self.source_positions.get(self.source_names[0], {}))
        return {n: dict(p) for n, p in self.source_positions.items()}

    def empty_plans(self) -> dict[str, SlicePlan]:
        """Slices with no input at the current positions (an epoch that only carries a barrier)."""
        return {n: SlicePlan(dict(p), dict(p)) for n, p in self.source_positions.items()}

    # -- an epoch finished ---------------------------------------------------------------
    def advance(self, epoch: int, plans: Mapping[str, SlicePlan], input_records: int,
                event_times: Mapping[str, tuple[int, int | None]], now_ms: int,
                watermarks: Mapping[str, int | None], final: bool) -> None:
        """`epoch` ran `plans` under `watermarks` and read `input_records`; `event_times`:
        per watermarked stream, the rows it brought and their largest event time."""
        self.epoch = epoch
        for name, plan in plans.items():
            self.source_positions[name] = dict(plan.end)
        if epoch > self.highest_epoch_run:
            self.highest_epoch_run = epoch
            self.records += input_records
        else:  # a restore rewound the sources: this epoch's input was counted when it first ran
            self.replayed_records += input_records
        for key, (rows, max_ts) in event_times.items():
            self.event_times.observe(key, rows, max_ts, now_ms)
        if not final:
            for step, watermark in watermarks.items():
                self.event_times.ran(step, watermark)

    # -- a checkpoint --------------------------------------------------------------------
    def to_checkpoint(self, now_ms: int, history: str) -> dict[str, Any]:
        """The checkpoint's `job` part. Its keys and their order are the checkpoint format
        (docs/checkpoint-format.md): checkpoints of earlier versions restore through `restore`.
        `history`: the line of epochs it is on (runtime/epoch_replay.py)."""
        return {"epoch": self.epoch, "max_event_time": self.max_event_time(), "watermark": self.watermark(now_ms),
                # each watermarked stream's largest event time, by watermark (runtime/graph.py)
                "event_times": dict(self.event_times.max_event_time),
                # the watermark each step last ran under: the steps after it take it next
                "step_watermarks": dict(self.event_times.step_marks),
                "records": self.records, "origin": self.origin,
                # The line of epochs this checkpoint is on: a failover to it replays that
                # line's logged epochs (runtime/epoch_replay.py).
                "history": history,
                # Where it was: a failover or rerun finds its own checkpoints without reading it.
                "origin_path": self.origin_path}

    def source_handles(self) -> dict[str, dict[str, Any]]:
        """Each source's part of a checkpoint, by source name."""
        return {name: {"positions": dict(positions)} for name, positions in self.source_positions.items()}

    # -- a restore -----------------------------------------------------------------------
    def restore(self, job: Mapping[str, Any], source_handles: Mapping[str, Mapping[str, Any] | None],
                initial_positions: Callable[[str], Positions], what: str) -> None:
        """Take the position of a checkpoint: its `job` part and each source's part (None
        for a source the checkpoint does not have: it starts from `initial_positions`).
        The record counts stay this run's: epochs re-run from here count as replayed."""
        self.origin = job.get("origin")
        self.origin_path = job.get("origin_path")
        self.epoch = int(job["epoch"])
        event_times = job.get("event_times")
        if event_times is None and len(self.event_times.delay) == 1:  # taken before graphs: one watermark
            event_times = {next(iter(self.event_times.delay)): job.get("max_event_time")}
        self.event_times.reset(event_times, job.get("step_watermarks"))
        for name in self.source_names:
            handle = source_handles.get(name)
            if handle is None:  # a source new in the graph starts where it starts
                log.info("source %s has no positions in %s; it starts from its initial positions", name, what)
                self.source_positions[name] = initial_positions(name)
            else:
                self.source_positions[name] = dict(handle["positions"])

    def start_fresh(self, initial_positions: Callable[[str], Positions]) -> None:
        """No checkpoint to restore: before the first epoch, every source at its start."""
        self.epoch = -1
        self.event_times.reset()
        self.source_positions = {n: initial_positions(n) for n in self.source_names}


# An epoch's plan in the epoch plan log and its slice identity: one source's as it always
# was; several sources' as {source name: positions}.
def join_plans(plans: Mapping[str, SlicePlan]) -> SlicePlan:
    if len(plans) == 1:
        return next(iter(plans.values()))
    return SlicePlan({n: dict(p.start) for n, p in plans.items()}, {n: dict(p.end) for n, p in plans.items()})


def split_plan(plan: SlicePlan, source_names: list[str]) -> dict[str, SlicePlan]:
    """`join_plans` undone."""
    if len(source_names) == 1:
        return {source_names[0]: plan}
    return {n: SlicePlan(dict(plan.start.get(n, {})), dict(plan.end.get(n, {}))) for n in source_names}
