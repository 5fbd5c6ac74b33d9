"""The store-opening decision of a subtask's task (executor/store_opening.py), one
test per row of its table: what the local store says about itself, the lineage and
what the driver planned decide between fresh, rebuild, retry, local and catch-up."""

from __future__ import annotations

from sparkpoint.runtime.executor.store_opening import EpochInput, How, LocalStore, decide, slice_identity
from sparkpoint.state.changelog import ChangelogFile, Lineage
from sparkpoint.state.snapshot import SnapshotFile

GEN = "g-now"
SLICE = slice_identity({"0": 0}, {"0": 500})
GIVEN = EpochInput(GEN, SLICE)


def log(epoch: int) -> ChangelogFile:
    name = f"{epoch:012d}-x.changelog"
    return ChangelogFile(epoch, SnapshotFile(name, f"shared/state/op/0/log/{name}", 10, "0" * 64, shared=True))


def lineage(up_to: int) -> Lineage:
    """A lineage with change logs of epochs 0..up_to (empty for -1)."""
    lin = Lineage("op", 0, (0, 4), 4)
    for e in range(up_to + 1):
        lin = lin.advance(log(e))
    return lin


def store_at(lin: Lineage, epoch: int, generation: str | None = GEN) -> LocalStore:
    """A store that replayed or committed `lin` up to `epoch`."""
    return LocalStore(epoch, lin.ref_at(epoch), lin.ref_at(epoch - 1), generation)


def committed_next(lin: Lineage, generation: str = GEN, slice_: str | None = SLICE) -> LocalStore:
    """A store that committed the epoch after `lin`'s tip (the task ran here before)."""
    return LocalStore(lin.epoch + 1, "shared/state/op/0/log/other.changelog", lin.tip_ref, generation, slice_)


def test_the_first_epoch_of_a_job_starts_fresh():
    d = decide(lineage(-1), 0, GIVEN, None)
    assert d.how is How.FRESH and "no usable local store" in d.why


def test_a_task_of_a_restore_rebuilds_whatever_is_on_local_disk():
    lin = lineage(3)
    d = decide(lin, 4, EpochInput(GEN, ""), store_at(lin, 3), trust_local=False)
    assert d.how is How.REBUILD and "not trusted" in d.why


def test_a_task_without_a_generation_never_uses_a_local_store():
    lin = lineage(3)
    assert decide(lin, 4, None, store_at(lin, 3)).how is How.REBUILD


def test_without_a_local_store_the_lineage_is_rebuilt():
    assert decide(lineage(2), 3, GIVEN, None).how is How.REBUILD


def test_a_store_of_an_earlier_generation_is_never_used_even_at_the_tip():
    lin = lineage(3)
    d = decide(lin, 4, GIVEN, store_at(lin, 3, generation="g-before"))
    assert d.how is How.REBUILD and "g-before" in d.why


def test_after_a_fresh_start_the_failed_attempts_epoch_0_is_not_a_retry():
    lin = lineage(-1)
    d = decide(lin, 0, GIVEN, committed_next(lin, generation="g-failed-attempt"))
    assert d.how is How.FRESH


def test_a_retry_needs_the_same_epoch_on_the_tip_in_the_same_generation_over_the_same_slice():
    lin = lineage(3)
    d = decide(lin, 4, GIVEN, committed_next(lin))
    assert d.how is How.RETRY and SLICE in d.why


def test_the_same_epoch_over_another_slice_is_not_a_retry():
    lin = lineage(3)
    other = slice_identity({"0": 0}, {"0": 900})
    assert decide(lin, 4, GIVEN, committed_next(lin, slice_=other)).how is How.REBUILD


def test_the_same_epoch_on_another_parent_is_not_a_retry():
    lin = lineage(3)
    stale = LocalStore(4, "shared/state/op/0/log/other.changelog", "somewhere-else", GEN, SLICE)
    assert decide(lin, 4, GIVEN, stale).how is How.REBUILD


def test_a_store_at_the_tip_of_this_generation_is_used():
    lin = lineage(3)
    assert decide(lin, 4, GIVEN, store_at(lin, 3)).how is How.LOCAL


def test_a_store_behind_on_the_lineage_catches_up():
    lin = lineage(5)
    d = decide(lin, 6, GIVEN, store_at(lin, 2))
    assert d.how is How.CATCH_UP and "epoch 2" in d.why


def test_a_store_ahead_of_the_lineage_is_rebuilt():
    lin = lineage(2)
    ahead = LocalStore(4, "shared/state/op/0/log/ahead.changelog", "p", GEN)
    assert decide(lin, 3, GIVEN, ahead).how is How.REBUILD


def test_a_store_off_the_lineage_is_rebuilt():
    lin = lineage(5)
    off = LocalStore(2, "shared/state/op/0/log/elsewhere.changelog", None, GEN)
    assert decide(lin, 6, GIVEN, off).how is How.REBUILD


def test_a_slice_identity_depends_on_positions_only():
    assert slice_identity({"0": 1, "1": 2}, {"0": 5, "1": 6}) == slice_identity({"1": 2, "0": 1}, {"1": 6, "0": 5})
    assert slice_identity({"0": 1}, {"0": 5}) != slice_identity({"0": 1}, {"0": 6})
