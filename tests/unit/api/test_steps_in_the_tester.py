"""The built-in keyed steps and processor timers, driven through the user's test harness
(sparkpoint.testing.ProcessorTester): the runtime's own epoch task on a real store, with
the watermark a job would derive, and a restore from snapshot files in the middle."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sparkpoint.api import KeyedAggregate, ProcessorOperator, StatefulProcessor, TumblingWindow
from sparkpoint.testing import ProcessorTester


def batches(seed: int, n: int, keys: int) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    return [pd.DataFrame({"key": rng.integers(0, keys, 200), "value": rng.normal(size=200).round(3),
                          "ts": rng.integers(i * 10_000, (i + 1) * 10_000, 200)}) for i in range(n)]


@pytest.mark.parametrize("restore_at", [None, 2])
def test_aggregate_totals_equal_a_groupby_over_all_rows_across_a_restore(restore_at) -> None:
    def step() -> KeyedAggregate:
        return KeyedAggregate("totals", ["key"], "value")

    data = batches(1, 5, 30)
    tester = ProcessorTester(step())
    outputs = []
    for i, batch in enumerate(data):
        if i == restore_at:
            tester = ProcessorTester.from_snapshot(step(), tester.snapshot())
        outputs.append(tester.process(batch))
        assert sorted(outputs[-1]["key"]) == sorted(batch["key"].unique())  # update mode: the keys touched
    expected = pd.concat(data).groupby("key")["value"].agg(["count", "sum", "min", "max"]).reset_index()
    got = tester.state().sort_values("key").reset_index(drop=True)[["key", "count", "sum", "min", "max"]]
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, atol=1e-9)
    # The last output of each key is its total now.
    latest = pd.concat(outputs).groupby("key").tail(1).sort_values("key").reset_index(drop=True)
    pd.testing.assert_frame_equal(latest[["key", "count", "sum", "min", "max"]], expected, check_dtype=False,
                                  atol=1e-9)


def test_window_counts_equal_a_reference_and_rows_past_lateness_are_dropped_and_counted() -> None:
    def step() -> TumblingWindow:
        return TumblingWindow("w", ["key"], "ts", size="10 s", allowed_lateness="25 s")

    data = batches(2, 6, 5)  # epoch i holds event times in [10 i s, 10 (i + 1) s)
    data[5] = pd.concat([data[5], pd.DataFrame({"key": [0, 1, 1], "value": 0.0, "ts": [1_000, 2_000, 25_000]})])
    tester = ProcessorTester(step(), watermark=("ts", "1 s"))
    outputs = []
    for i, batch in enumerate(data):
        if i == 3:
            tester = ProcessorTester.from_snapshot(step(), tester.snapshot(), watermark=("ts", "1 s"))
        outputs.append(tester.process(batch))
    outputs.append(tester.finish())
    output = pd.concat(outputs)
    # By hand: epoch 4 runs with watermark (largest event time of epochs 0-3) - 1 s >= 30 s, so window
    # [20 s, 30 s) has fired by then; epoch 5's is below 49 s. There, window [0, 10 s) is past its
    # lateness (10 s + 25 s <= watermark): its two late rows are dropped and counted. Window [20 s, 30 s)
    # is within lateness (55 s > watermark): it fires again with the late row counted.
    assert int(pd.concat(data[:4])["ts"].max()) - 1_000 >= 30_000
    assert tester.late_rows_dropped == 2
    on_time = pd.concat(data).iloc[:-3]
    on_time = pd.concat([on_time, pd.DataFrame({"key": [1], "value": 0.0, "ts": [25_000]})])
    expected = on_time.assign(window_start=on_time["ts"] // 10_000 * 10_000).groupby(["key", "window_start"]) \
        .size().rename("count").reset_index()
    final = output.groupby(["key", "window_start"])["count"].last().reset_index()  # the last firing counts
    pd.testing.assert_frame_equal(final.sort_values(["key", "window_start"]).reset_index(drop=True),
                                  expected.sort_values(["key", "window_start"]).reset_index(drop=True),
                                  check_dtype=False)
    refired = output[(output["key"] == 1) & (output["window_start"] == 20_000)]
    assert refired["count"].tolist()[-1] == refired["count"].tolist()[0] + 1


class Expiry(StatefulProcessor):
    def init(self, handle) -> None:
        self.handle = handle

    def handle_input_rows(self, key, rows, timer_values):
        for ts in rows["ts"]:
            self.handle.registerTimer(int(ts) + 100)
        return iter(())

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        yield pd.DataFrame({"user": [key[0]], "expired_at": [expired_timer_info.getExpiryTimeInMs()],
                            "watermark": [timer_values.getCurrentWatermarkInMs()]})


def test_event_time_timers_fire_in_timestamp_order_across_keys_and_a_restore() -> None:
    def step() -> ProcessorOperator:
        return ProcessorOperator("expiry", Expiry, ["user"], "user STRING, expired_at BIGINT, watermark BIGINT",
                                 time_mode="eventtime")

    tester = ProcessorTester(step())
    tester.process(pd.DataFrame({"user": ["zed", "amy", "amy", "bo"], "ts": [50, 300, 10, 250]}))
    assert tester.list_timers("amy") == [110, 400]
    tester = ProcessorTester.from_snapshot(step(), tester.snapshot())
    out = tester.advance_watermark(350)
    assert list(zip(out["user"], out["expired_at"])) == [("amy", 110), ("zed", 150), ("bo", 350)]
    assert set(out["watermark"]) == {350}
    assert tester.advance_watermark(399).empty
    final = tester.finish()
    assert list(zip(final["user"], final["expired_at"])) == [("amy", 400)]
