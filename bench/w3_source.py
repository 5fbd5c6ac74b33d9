"""W3 (large state) source: a load phase that emits every key exactly once, then
change epochs in each of which `changed` distinct keys get one event each.

Global event number g (as GeneratorSource: record `id` of split s is g = id * splits + s)
maps to key = (g * STRIDE) mod keys. STRIDE is a prime that does not divide `keys`, so
g -> key is a bijection on any `keys` consecutive event numbers: g < keys (the load
phase) covers every key once, and any window of at most `keys` events after that
touches distinct keys, scattered over the whole key space (not a contiguous range,
so the changes land in every SST, as real updates would).

Epoch sizes: `load_epoch_records` per epoch until every split has emitted its share of
the load phase, then exactly `changed` records per epoch (keys, changed and
load_epoch_records should be multiples of `splits`). Replayable like GeneratorSource:
an event is a pure function of (seed, split, offset).
"""

from __future__ import annotations

from sparkpoint.connectors.base import Positions, SlicePlan
from sparkpoint.connectors.generator import GeneratorSource, _num

STRIDE = 1_000_003  # prime: coprime to any key count that is not a multiple of it


class W3Source(GeneratorSource):
    def __init__(self, name: str = "events", *, keys: int, changed: int, change_epochs: int,
                 load_epoch_records: int = 1_000_000, splits: int = 2, seed: int = 7):
        if keys % STRIDE == 0:
            raise ValueError(f"keys must not be a multiple of {STRIDE}")
        if changed > keys:
            raise ValueError("changed keys per epoch cannot exceed keys")
        super().__init__(name, keys=keys, splits=splits, total_events=keys + changed * change_epochs,
                         max_records_per_epoch=load_epoch_records, seed=seed)
        self.changed = changed
        self.change_epochs = change_epochs
        self.load_per_split = max(1, load_epoch_records // splits)
        self.change_per_split = max(1, changed // splits)

    def load_total(self, split: int) -> int:
        """Records of `split` in the load phase: ids with id * splits + split < keys."""
        return max(0, -(-(self.keys - split) // self.splits))

    def load_epochs(self) -> int:
        return max(-(-self.load_total(s) // self.load_per_split) for s in range(self.splits))

    def plan(self, positions: Positions) -> SlicePlan:
        end = {}
        for split, start in positions.items():
            s = int(split)
            load_end = self.load_total(s)
            stop = min(start + self.load_per_split, load_end) if start < load_end else start + self.change_per_split
            end[split] = min(stop, self._split_total(s))
        return SlicePlan(dict(positions), end)

    def _key_sql(self, g: str) -> str:
        return f"pmod({g} * {_num(STRIDE)}, {_num(self.keys)})"

    def _ts_sql(self, g: str) -> str:
        return f"{_num(self.start_ts_ms)} + {g}"
