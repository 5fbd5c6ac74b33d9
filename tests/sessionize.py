"""The README's sessionization processor, as written there, shared by the tests that
run it through the processor tester and through a job."""

from __future__ import annotations

import pandas as pd

from sparkpoint import StatefulProcessor

GAP_MS = 30_000


class Sessionize(StatefulProcessor):
    """Sessions per key that close GAP_MS of event time after the key's last event."""

    def init(self, handle):
        self.handle = handle
        self.session = handle.getValueState("session", "first BIGINT, last BIGINT, events BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        first, last, events = self.session.get() if self.session.exists() else (None, None, 0)
        for pdf in rows:
            first = int(pdf["ts"].min()) if first is None else min(first, int(pdf["ts"].min()))
            last = int(pdf["ts"].max()) if last is None else max(last, int(pdf["ts"].max()))
            events += len(pdf)
        for timer in self.handle.listTimers():
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(last + GAP_MS)
        self.session.update((first, last, events))
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        first, last, events = self.session.get()
        self.session.clear()
        yield pd.DataFrame({"key": [key[0]], "session_start": [first], "session_end": [last], "events": [events]})
