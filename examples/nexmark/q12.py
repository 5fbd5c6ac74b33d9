"""Nexmark q12, processing-time windows: how many bids each bidder made in each 10 s
window of processing time.

    sparkpoint run examples/nexmark/q12.py      # input and output: docs/nexmark.md

nexmark-flink:
    CREATE VIEW B AS SELECT *, PROCTIME() AS p_time FROM bid;
    SELECT bidder, count(*) AS bid_count, window_start AS starttime, window_end AS endtime
    FROM TABLE(TUMBLE(TABLE B, DESCRIPTOR(p_time), INTERVAL '10' SECOND))
    GROUP BY bidder, window_start, window_end

Spark counts each epoch's bids per bidder; then one custom stateful step in processing
time (`BidsPerProcessingWindow`), keyed by bidder, adds them to the 10 s window (aligned
to the Unix epoch, as TUMBLE's) of the epoch's processing time. A window's count is kept
in map state under its start, and a processing-time timer at the window's end emits
(bidder, bid_count, starttime, endtime) once, in the first epoch whose processing time
has passed it (or at the end of input, which fires every window still open).

What differs from Flink, and why:
  - PROCTIME() is the epoch's processing time: the wall-clock time at which the driver
    planned the epoch that read the bid, one value for all bids of an epoch
    (`timer_values.getCurrentProcessingTimeInMs()`). Flink takes the time each row
    reaches the window operator. So a window here holds whole epochs, and it fires at
    the first epoch boundary after its end, not on a wall-clock timer.
  - The result depends on when the job ran, in Flink too; it is exactly-once all the
    same. The processing time is fixed before an epoch runs and handed to every
    subtask; with a sink that keeps an epoch plan log (Kafka), an epoch replayed after a
    restore runs with the processing time recorded when it was planned. With the Parquet
    sink used here, a restore withdraws the output of the epochs after the restored
    checkpoint, and they run again at the new processing time: the committed output is
    that of one run in which every bid counts once, in the window of the epoch that
    read it.
"""

import pandas as pd
from pyspark.sql import functions as F

from sparkpoint import Pipeline, ProcessorOperator, StatefulProcessor
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

WINDOW_MS = 10_000
COUNTS = "bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP, endtime TIMESTAMP"


class BidsPerProcessingWindow(StatefulProcessor):
    def init(self, handle):
        self.handle = handle
        self.counts = handle.getMapState("counts", "starttime BIGINT", "bid_count BIGINT")

    def handle_input_rows(self, key, rows, timer_values):
        now = timer_values.getCurrentProcessingTimeInMs()
        start = now - now % WINDOW_MS
        held = self.counts.getValue(start)
        if held is None:
            self.handle.registerTimer(start + WINDOW_MS)
        self.counts.updateValue(start, (held[0] if held else 0) + int(rows["bids"].sum()))
        return ()

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        end = expired_timer_info.getExpiryTimeInMs()
        held = self.counts.getValue(end - WINDOW_MS)
        self.counts.removeKey(end - WINDOW_MS)
        if held is not None:
            yield pd.DataFrame({"bidder": [key[0]], "bid_count": [held[0]],
                                "starttime": [pd.Timestamp(end - WINDOW_MS, unit="ms", tz="UTC")],
                                "endtime": [pd.Timestamp(end, unit="ms", tz="UTC")]})


pipeline = Pipeline("nexmark-q12")
(pipeline.read(nexmark_input("bid"))
 .transform(lambda bids: bids.groupBy("bidder").agg(F.count("*").alias("bids")))
 .stateful(ProcessorOperator("bids-per-processing-window", BidsPerProcessingWindow, ["bidder"], COUNTS,
                             time_mode="processingtime"))
 .sink(nexmark_output("q12")))
