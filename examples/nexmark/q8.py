"""Nexmark q8, monitor new users: the people who opened an auction in the same 10 s
window in which they registered.

    sparkpoint run examples/nexmark/q8.py      # input and output: docs/nexmark.md

nexmark-flink:
    SELECT P.id, P.name, P.starttime
    FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
          FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
          GROUP BY id, name, window_start, window_end) P
    JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
          FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
          GROUP BY seller, window_start, window_end) A
    ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime
into the sink columns id, name, stime.

A window join (`WindowJoin`) of people and auctions by person id = seller. It emits one
pair per auction, while the SQL groups each side by window first, so a seller with
several auctions in the window is listed once: the pairs are made distinct as they come
out. That is exact, because a window join emits all pairs of one key and window
together, once, when the watermark passes the window's end.
"""

from sparkpoint import Pipeline, WindowJoin
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output

WINDOW = "10 s"


def distinct_registrations(pairs):
    """One (id, name, stime) per person and window, whatever the number of auctions."""
    found = pairs.group_by(["id", "name", "window_start"], use_threads=False).aggregate([])
    return found.select(["id", "name", "window_start"]).rename_columns(["id", "name", "stime"])


pipeline = Pipeline("nexmark-q8")
people = (pipeline.read(nexmark_input("person")).transform(lambda p: p.select("id", "name", "dateTime"))
          .watermark(EVENT_TIME, WATERMARK_DELAY))
sellers = (pipeline.read(nexmark_input("auction")).transform(lambda a: a.select("seller", "dateTime"))
           .watermark(EVENT_TIME, WATERMARK_DELAY))
(people.join(sellers, WindowJoin("registered-and-sold", left_on="id", right_on="seller",
                                 left_time=EVENT_TIME, right_time=EVENT_TIME, size=WINDOW))
 .map_output(distinct_registrations)
 .sink(nexmark_output("q8")))
