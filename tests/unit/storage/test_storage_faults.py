"""Storage fault rules: the right operations, paths and checkpoints misbehave, the
right number of times, and rules come from configuration."""

from __future__ import annotations

import pytest
from storage_support import complete_checkpoint

from sparkpoint.errors import ConfigError, CorruptCheckpointError, StorageError
from sparkpoint.faults import FaultAction, FaultKind, FaultOp, FaultyStorageFS, parse_fault_rules
from sparkpoint.storage import metadata
from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage
from sparkpoint.storage.layout import checkpoint_id_in_path


def faulty_storage(storage: FsCheckpointStorage, rules, **kw) -> FsCheckpointStorage:
    return FsCheckpointStorage(FaultyStorageFS(storage.fs, rules, **kw), storage.layout)


def test_upload_rule_fails_only_matching_checkpoints(storage: FsCheckpointStorage, tmp_path) -> None:
    faulty = FaultyStorageFS(storage.fs, [{"op": "upload", "path": "*/chk-*/**", "checkpoints": [3, 4],
                                           "action": "fail"}])
    local = tmp_path / "f.sst"
    local.write_bytes(b"data")
    layout = storage.layout
    faulty.put_file(str(local), layout.join("chk-2/state/f.sst"))
    faulty.put_file(str(local), layout.join("shared/f.sst"))
    with pytest.raises(StorageError, match="injected fault: upload of .*chk-3/state/f.sst"):
        faulty.put_file(str(local), layout.join("chk-3/state/f.sst"))
    with pytest.raises(StorageError):
        faulty.put_file(str(local), layout.join("chk-4/x"))
    faulty.write_atomic(layout.join("chk-3/other"), b"a write, not an upload")
    assert [(f.op, checkpoint_id_in_path(f.path)) for f in faulty.fired] == [(FaultOp.UPLOAD, 3),
                                                                            (FaultOp.UPLOAD, 4)]


def test_truncated_metadata_write_is_caught_by_the_reader(storage: FsCheckpointStorage) -> None:
    faulty = faulty_storage(storage, [{"op": "create_exclusive", "path": "re:/_metadata$",
                                       "action": "truncate"}])
    complete_checkpoint(faulty, 1, {"shared/a": b"a"})
    with pytest.raises(CorruptCheckpointError):
        metadata.decode(storage.fs.read_bytes(storage.layout.metadata(1)))
    assert storage.load_completed() == []


def test_slow_rule_delays_then_succeeds(storage: FsCheckpointStorage) -> None:
    slept: list[float] = []
    faulty = FaultyStorageFS(storage.fs, parse_fault_rules("{op: read, action: slow(2.5)}"),
                             sleep=slept.append)
    faulty.write_atomic(storage.layout.join("x"), b"1")
    assert faulty.read_bytes(storage.layout.join("x")) == b"1" and slept == [2.5]


def test_rules_can_be_added_and_removed_at_runtime(storage: FsCheckpointStorage) -> None:
    faulty = FaultyStorageFS(storage.fs)
    name = faulty.add_rule({"op": "any", "action": "fail"})
    with pytest.raises(StorageError):
        faulty.ls(storage.layout.root)
    assert faulty.remove_rule(name) and faulty.ls(storage.layout.root) == []


def test_parse_from_yaml_and_json() -> None:
    rules = parse_fault_rules("""
rules:
  - {op: upload, path: "*/chk-*/**", checkpoints: [3, 4], action: fail, times: 2, name: up}
  - {op: delete, action: slow, seconds: 1}
""")
    assert rules[0].op is FaultOp.UPLOAD and rules[0].checkpoints == {3, 4} and rules[0].times == 2
    assert rules[1].action == FaultAction(FaultKind.SLOW, 1.0) and rules[1].times is None
    assert parse_fault_rules('[{"op": "read", "action": {"slow": 3}}]')[0].action.seconds == 3.0


@pytest.mark.parametrize("bad, message", [
    ({"op": "rename", "action": "fail"}, "op 'rename' is unknown"),
    ({"op": "read"}, "has no 'action'"),
    ({"op": "read", "action": "explode"}, "action 'explode' is unknown"),
    ({"op": "read", "action": "slow"}, "needs 'seconds'"),
    ({"op": "read", "action": "fail", "times": 0}, "positive integer"),
    ({"op": "read", "action": "fail", "paht": "x"}, r"unknown keys \['paht'\]"),
])
def test_bad_config_is_refused_with_what_is_accepted(bad, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_fault_rules(bad)


def test_participant_rules_in_the_shared_config_list_are_left_alone(storage, tmp_path) -> None:
    from sparkpoint.storage.checkpoint_storage import open_job_storage

    config = [{"participant": "state:*", "action": "async_error"},
              {"op": "create_exclusive", "path": "*/_metadata", "action": "fail"}]
    assert [r.op for r in parse_fault_rules(config)] == [FaultOp.CREATE_EXCLUSIVE]
    js = open_job_storage(str(tmp_path), "rehearsal",
                          wrap_fs=lambda fs: FaultyStorageFS(fs, parse_fault_rules(config)))
    js.lease.acquire()
    with pytest.raises(StorageError, match="injected fault"):
        complete_checkpoint(js.checkpoints, 1, {"shared/a": b"a"})
    assert open_job_storage(str(tmp_path), "rehearsal").checkpoints.load_completed() == []
