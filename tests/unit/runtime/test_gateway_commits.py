"""The gateway remembers a failed post-completion commit until a later one succeeds, so
the job can retry the final checkpoint's commit instead of reporting FINISHED over
output that is still staged."""

from __future__ import annotations

from sparkpoint.runtime.gateway import RuntimeGateway


class Flaky:
    def __init__(self, failures: int):
        self.failures = failures
        self.committed: list[int] = []

    def __call__(self, checkpoint_id, data):
        if self.failures:
            self.failures -= 1
            raise OSError(f"injected: commit of {checkpoint_id}")
        self.committed.append(checkpoint_id)


def test_a_failed_commit_is_remembered_until_a_later_commit_or_a_retry_succeeds():
    commit = Flaky(failures=1)
    gateway = RuntimeGateway(["job"], commit)
    try:
        gateway.notify_complete(3, "data-3")
        gateway.drain_commits()
        checkpoint_id, data, error = gateway.failed_commit()
        assert (checkpoint_id, data, str(error)) == (3, "data-3", "injected: commit of 3")

        gateway.commit_again(checkpoint_id, data)
        assert gateway.failed_commit() is None and commit.committed == [3]

        commit.failures = 1
        gateway.notify_complete(4, "data-4")
        gateway.notify_complete(5, "data-5")  # cumulative: publishes 4's output too
        gateway.drain_commits()
        assert gateway.failed_commit() is None and commit.committed == [3, 5]
    finally:
        gateway.shutdown()
