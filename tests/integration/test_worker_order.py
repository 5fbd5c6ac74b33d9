"""Each epoch may give its Spark tasks the subtasks in another order (partition i carries
subtask `partition_order[i]`, chosen so subtasks go back to the Python worker that keeps
their store open). Whatever the order, every subtask gets exactly its own key groups and
the job's output is the same."""

from __future__ import annotations

import pyarrow as pa
import pytest

import sparkpoint.runtime.graph_epoch as graph_epoch_module
from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline, Settings
from sparkpoint.connectors.parquet_sink import read_committed
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.stage import EpochResult
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark

PARALLELISM = 3


def _run(spark, root, name: str) -> pa.Table:
    pipeline = (Pipeline(name).source(GeneratorSource("ev", keys=500, total_events=20_000, max_records_per_epoch=4_000))
                .stateful(KeyedAggregate("agg", ["key"], "value", aggs=("count", "sum"), value_type="bigint"))
                .sink(ParquetSink(str(root / name / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": name, "parallelism.default": PARALLELISM,
        "execution.checkpointing.dir": str(root / name / "chk"), "execution.checkpointing.interval": "100 ms",
        "state.local.dir": str(root / name / "state"), "sparkpoint.progress": False,
        "restart-strategy.type": "none"})
    result = JobMaster(pipeline, settings, spark=spark).run()
    assert result.status == JobStatus.FINISHED
    out = read_committed(str(root / name / "out"))
    return out.sort_by([("epoch", "ascending"), ("key", "ascending")])


def test_worker_order_lists_subtasks_by_when_their_tasks_ended() -> None:
    result = EpochResult(None, 0, None, {}, {}, {}, infos={0: {"ended_at": 30.5}, 1: {"ended_at": 10.0},
                                                         2: {"ended_at": 20.0}})
    assert result.worker_order == [1, 2, 0]


def test_any_partition_order_gives_every_subtask_its_own_rows_and_the_same_output(spark, tmp_path, monkeypatch):
    reference = _run(spark, tmp_path, "identity")

    orders: list = []
    real_run_epoch = graph_epoch_module.run_epoch

    def rotating(*args):
        # Every epoch another rotation of the subtasks over the partitions.
        order = [(s + len(orders)) % PARALLELISM for s in range(PARALLELISM)]
        orders.append(order)
        return real_run_epoch(*args[:6], order)

    monkeypatch.setattr(graph_epoch_module, "run_epoch", rotating)
    rotated = _run(spark, tmp_path, "rotated")
    assert len({tuple(o) for o in orders}) == PARALLELISM  # every rotation was used
    assert rotated.equals(reference)


def test_the_routing_columns_are_built_once_per_session_and_shape(spark) -> None:
    """Building them costs about 100 py4j round trips: an epoch of the same step reuses
    them (the rotations above each reuse theirs), another order or step shape does not."""
    from sparkpoint.runtime.stage import _routing_columns

    built = _routing_columns(spark, ("key",), PARALLELISM, 128, (0, 1, 2))
    assert _routing_columns(spark, ("key",), PARALLELISM, 128, (0, 1, 2)) is built
    assert _routing_columns(spark, ("key",), PARALLELISM, 128, (2, 0, 1)) is not built
    assert _routing_columns(spark, ("key", "other"), PARALLELISM, 128, (0, 1, 2)) is not built
