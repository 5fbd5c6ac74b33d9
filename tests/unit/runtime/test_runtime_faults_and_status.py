import threading

import pytest

from sparkpoint.errors import ConfigError
from sparkpoint.faults import InjectedFault, ParticipantFaults
from sparkpoint.runtime.status import JobStatus, JobStatusTracker


def test_participant_fault_rules_from_config():
    f = ParticipantFaults.from_rules([
        {"participant": "state:*/1", "action": "sync_error", "checkpoints": [3]},
        {"participant": "sink:*", "action": "async_error", "times": 1},
        {"participant": "state:*", "action": "lose_ack", "checkpoints": [5]},
        {"op": "upload", "path": "*", "action": "fail"},  # a storage rule: ignored here
    ])
    assert f.sync_failures(3, ["state:w/0", "state:w/1"]) == (1,)
    assert f.sync_failures(4, ["state:w/0", "state:w/1"]) == ()
    with pytest.raises(InjectedFault):
        f.before_async("sink:parquet", 7, threading.Event())
    f.before_async("sink:parquet", 8, threading.Event())  # times=1: retired
    assert f.lose_ack("state:w/0", 5) and not f.lose_ack("state:w/0", 6)


def test_bad_participant_rule_is_a_config_error():
    with pytest.raises(ConfigError, match="action must be one of"):
        ParticipantFaults.from_rules([{"participant": "x", "action": "explode"}])


def test_job_status_transitions_and_listeners():
    t = JobStatusTracker()
    seen = []
    t.add_listener(lambda old, new, err: seen.append((old, new)))
    t.add_listener(lambda *a: (_ for _ in ()).throw(RuntimeError("listener bug")))  # must not break it
    for s in (JobStatus.RUNNING, JobStatus.FAILING, JobStatus.RESTARTING, JobStatus.RUNNING, JobStatus.FINISHED):
        t.transition(s)
    assert seen[-1] == (JobStatus.RUNNING, JobStatus.FINISHED)
    assert t.status.terminal
    with pytest.raises(RuntimeError, match="illegal"):
        t.transition(JobStatus.RUNNING)
