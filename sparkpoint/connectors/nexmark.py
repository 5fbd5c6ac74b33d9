"""Nexmark's three event streams (person, auction, bid), generated deterministically.

The rules follow the generator of the Nexmark benchmark as nexmark-flink ships it, so the
queries written for it find the same shape of data here:

* Event number n (from 0) is a person, an auction or a bid by its place in a cycle of
  person + auction + bid proportions (1 + 3 + 46 = 50 by default): the first slot of every
  cycle is a person, the next three are auctions, the last 46 are bids.
* Ids are dense and follow from n alone: person ids and auction ids both start at 1000, and
  the k-th person of the whole stream has id 1000 + k. Bids and auctions point at people
  and auctions that already exist, with a "lead" of up to 10 ids past the newest one (so a
  few references arrive before their target, as in nexmark), and mostly at a hot one: the
  first of the newest block of 100 (auctions, sellers) or its second (bidders).
* Event time is `base_time_ms + floor(n * 1e6 / rate) // 1000`: `rate` events per second
  of event time, the same for every stream, so each stream is in event-time order.

Every value of event n is a pure function of (seed, n): a counter-based hash draws it, never
a stateful random generator. Generating [0, N) in one call or in any number of chunks gives
the same rows, which is what a replayable source and exactly-once tests need.

What differs from nexmark-flink is listed in docs/nexmark.md.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
# Referenced ids may run this far past the newest one generated (nexmark's "lead").
ID_LEAD = 10
# Hot sellers, bidders and auctions are picked from blocks of this many ids.
HOT_BLOCK = 100
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
NUM_CHANNELS = 10_000
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter",
               "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")

TIMESTAMP = pa.timestamp("ms", tz="UTC")
PERSON_SCHEMA = pa.schema([
    ("id", pa.int64()), ("name", pa.string()), ("emailAddress", pa.string()),
    ("creditCard", pa.string()), ("city", pa.string()), ("state", pa.string()),
    ("dateTime", TIMESTAMP), ("extra", pa.string()),
])
AUCTION_SCHEMA = pa.schema([
    ("id", pa.int64()), ("itemName", pa.string()), ("description", pa.string()),
    ("initialBid", pa.int64()), ("reserve", pa.int64()), ("dateTime", TIMESTAMP),
    ("expires", TIMESTAMP), ("seller", pa.int64()), ("category", pa.int64()), ("extra", pa.string()),
])
BID_SCHEMA = pa.schema([
    ("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()), ("channel", pa.string()),
    ("url", pa.string()), ("dateTime", TIMESTAMP), ("extra", pa.string()),
])
SCHEMAS = {"person": PERSON_SCHEMA, "auction": AUCTION_SCHEMA, "bid": BID_SCHEMA}

# Generation works in slices of at most this many events, which keeps every string
# column's byte count well inside Arrow's 32-bit offsets.
_SLICE = 1_000_000
_POOL = 1 << 20
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class NexmarkConfig:
    """The generator's knobs, with nexmark-flink's defaults.

    `rate` is events per second of event time over all three streams (nexmark's
    `first-event.rate`); `base_time_ms` is the event time of event 0. Nexmark defaults
    the base time to the wall clock; here it is fixed so that runs repeat.
    """

    seed: int = 0
    rate: float = 10_000.0
    base_time_ms: int = 1_700_000_000_000
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"nexmark rate must be positive events per second, got {self.rate}")
        for name in ("person_proportion", "auction_proportion", "bid_proportion"):
            if getattr(self, name) < 1:
                raise ValueError(f"nexmark {name} must be at least 1, got {getattr(self, name)}")
        for name in ("hot_auction_ratio", "hot_sellers_ratio", "hot_bidders_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"nexmark {name} must be at least 1, got {getattr(self, name)}")
        for name in ("avg_person_bytes", "avg_auction_bytes", "avg_bid_bytes"):
            if not 0 <= getattr(self, name) <= _POOL // 4:
                raise ValueError(f"nexmark {name} must be between 0 and {_POOL // 4}, got {getattr(self, name)}")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion


@dataclass(frozen=True)
class NexmarkEvents:
    """The events of one range of event numbers, split by stream, each in event-time order."""

    person: pa.Table
    auction: pa.Table
    bid: pa.Table

    def stream(self, name: str) -> pa.Table:
        return {"person": self.person, "auction": self.auction, "bid": self.bid}[name]


# ---------------------------------------------------------------- the id and time rules

def kinds(config: NexmarkConfig, numbers: np.ndarray) -> np.ndarray:
    """0 for a person, 1 for an auction, 2 for a bid, per event number."""
    offset = numbers % config.total_proportion
    return np.where(offset < config.person_proportion, 0,
                    np.where(offset < config.person_proportion + config.auction_proportion, 1, 2))


def last_person(config: NexmarkConfig, numbers: np.ndarray) -> np.ndarray:
    """The newest person id (base 0) as of event n; n's own id when n is a person."""
    cycle, offset = np.divmod(numbers, config.total_proportion)
    return cycle * config.person_proportion + np.minimum(offset, config.person_proportion - 1)


def last_auction(config: NexmarkConfig, numbers: np.ndarray) -> np.ndarray:
    """The newest auction id (base 0) as of event n; n's own id when n is an auction.
    -1 before the first auction."""
    p, a = config.person_proportion, config.auction_proportion
    cycle, offset = np.divmod(numbers, config.total_proportion)
    in_cycle = np.clip(offset - p, -1, a - 1)
    # A person opens its cycle: the newest auction is the last of the previous cycle.
    return np.where(in_cycle < 0, cycle * a - 1, cycle * a + in_cycle)


def event_time_ms(config: NexmarkConfig, numbers: np.ndarray) -> np.ndarray:
    delay_us = 1_000_000.0 / config.rate
    return config.base_time_ms + np.floor(numbers.astype(np.float64) * delay_us).astype(np.int64) // 1000


# ---------------------------------------------------------------- counter-based draws

def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, on uint64 arrays (wrapping arithmetic is intended)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _mix_int(x: int) -> int:
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class _Draws:
    """Independent pseudo-random values per (seed, event number, slot): every field of an
    event has its own slot, so adding a field never shifts another field's values."""

    def __init__(self, seed: int, numbers: np.ndarray):
        self._seed = seed
        self._scrambled = numbers.astype(np.uint64) * np.uint64(_GOLDEN)

    def bits(self, slot: int) -> np.ndarray:
        key = _mix_int(_mix_int(self._seed * _GOLDEN + 0x5EED) + slot * 0xD1B54A32D192ED03)
        return _mix(self._scrambled ^ np.uint64(key))

    def uniform(self, slot: int) -> np.ndarray:
        return (self.bits(slot) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

    def below(self, slot: int, bound) -> np.ndarray:
        """Integers uniform in [0, bound) (bound a scalar or an array, at least 1)."""
        return np.floor(self.uniform(slot) * bound).astype(np.int64)


def _round_half_up(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5).astype(np.int64)


def _prices(draws: _Draws, slot: int) -> np.ndarray:
    """Log-uniform over 1 to 1 000 000 units, in cents, as nexmark prices are."""
    return _round_half_up(np.power(10.0, draws.uniform(slot) * 6.0) * 100.0)


class _Pool:
    """A long run of random characters; strings are slices of it. Arrow's string views point
    into it without copying, and one cast packs them into a plain string column, which keeps
    the per-byte work out of Python."""

    def __init__(self, chars: np.ndarray):
        self.chars = chars
        self.buffer = pa.py_buffer(chars)
        padded = np.concatenate([chars, np.zeros(16, dtype=np.uint8)]).astype(np.uint32)
        # The four bytes from each position as one little-endian word: a view's prefix.
        self.words = (padded[:-3] | padded[1:-2] << 8 | padded[2:-1] << 16 | padded[3:] << 24)

    def strings(self, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
        n = len(starts)
        views = np.zeros((n, 4), dtype=np.uint32)
        views[:, 0] = lengths
        inline = lengths <= 12
        for k in range(3):
            # Short strings live in the view itself, zero-padded.
            keep = np.clip(lengths - 4 * k, 0, 4)
            mask = ((np.uint64(1) << (keep.astype(np.uint64) * np.uint64(8))) - np.uint64(1)).astype(np.uint32)
            word = self.words[starts + 4 * k] & mask
            views[:, 1 + k] = np.where(inline, word, views[:, 1 + k]) if k else word
        views[~inline, 2] = 0
        views[~inline, 3] = starts[~inline]
        array = pa.Array.from_buffers(pa.string_view(), n, [None, pa.py_buffer(views), self.buffer])
        return array.cast(pa.string())


@functools.lru_cache(maxsize=8)
def _pools(seed: int) -> tuple[_Pool, _Pool]:
    """Random characters for a seed: lowercase letters with one space in 13 but never two in
    a row (words), and letters only (padding)."""
    draws = _Draws(seed, np.arange(_POOL, dtype=np.int64))
    letters = (ord("a") + draws.below(900, 26)).astype(np.uint8)
    space = draws.below(901, 13) == 0
    space[1:] &= ~space[:-1]
    words = np.where(space, np.uint8(ord(" ")), letters)
    return _Pool(words), _Pool(letters)


def _words(seed: int, draws: _Draws, slot: int, max_length: int) -> pa.Array:
    """Random text of 3 to max_length - 1 characters with the odd space, trimmed at both
    ends as nexmark trims it."""
    words, _ = _pools(seed)
    lengths = 3 + draws.below(slot, max_length - 3)
    starts = (draws.bits(slot + 1) % np.uint64(_POOL - max_length)).astype(np.int64)
    leading = words.chars[starts] == ord(" ")
    starts, lengths = starts + leading, lengths - leading
    lengths = lengths - (words.chars[starts + lengths - 1] == ord(" "))
    return words.strings(starts, lengths)


def _padding(seed: int, draws: _Draws, slot: int, current_size: np.ndarray, average_size: int) -> pa.Array:
    """Letters that bring a row to `average_size` bytes on average (within +-20 %), as
    nexmark's `extra` column does; empty when the row is already larger."""
    _, letters = _pools(seed)
    wanted = np.maximum(average_size - current_size, 0)
    spread = _round_half_up(wanted * 0.2)
    lengths = wanted - spread + np.where(spread > 0, draws.below(slot, np.maximum(2 * spread, 1)), 0)
    lengths = np.where(current_size > average_size, 0, lengths)
    starts = (draws.bits(slot + 1) % np.uint64(_POOL - 2 * average_size - 2)).astype(np.int64)
    return letters.strings(starts, lengths)


def _string_array(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    return pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets.astype(np.int32)),
                                       pa.py_buffer(data))


def _take(values: tuple[str, ...] | pa.Array, index: np.ndarray) -> pa.Array:
    array = values if isinstance(values, pa.Array) else pa.array(values, pa.string())
    return array.take(pa.array(index))


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms, pa.int64()).cast(TIMESTAMP)


def _string_lengths(array: pa.Array) -> np.ndarray:
    return pc.binary_length(array).to_numpy(zero_copy_only=False).astype(np.int64)


# ---------------------------------------------------------------- references to people and auctions

def _some_person(config: NexmarkConfig, draws: _Draws, slot: int, numbers: np.ndarray) -> np.ndarray:
    """A person among the most recent `num_active_people`, or up to ID_LEAD ahead (base 0)."""
    people = last_person(config, numbers) + 1
    active = np.minimum(people, config.num_active_people)
    return people - active + draws.below(slot, active + ID_LEAD)


def _some_auction(config: NexmarkConfig, draws: _Draws, slot: int, numbers: np.ndarray) -> np.ndarray:
    """An auction likely still open: among the last `num_in_flight_auctions`, or up to
    ID_LEAD ahead (base 0)."""
    newest = last_auction(config, numbers)
    oldest = np.maximum(newest - config.num_in_flight_auctions, 0)
    return oldest + draws.below(slot, newest - oldest + 1 + ID_LEAD)


def _is_hot(draws: _Draws, slot: int, ratio: int) -> np.ndarray:
    # Hot with probability 1 - 1/ratio, as nexmark's `nextInt(ratio) > 0`.
    return draws.below(slot, ratio) > 0


# ---------------------------------------------------------------- the three streams

def _people(config: NexmarkConfig, numbers: np.ndarray) -> pa.Table:
    draws = _Draws(config.seed, numbers)
    seed = config.seed
    n = len(numbers)
    name_index = draws.below(1, len(FIRST_NAMES)) * len(LAST_NAMES) + draws.below(2, len(LAST_NAMES))
    name = _take(_full_names(), name_index)
    email = pc.binary_join_element_wise(_words(seed, draws, 3, 7), _words(seed, draws, 5, 5), "@")
    email = pc.binary_join_element_wise(email, pa.scalar(""), ".com")
    card = _credit_cards(draws, 7, n)
    city = _take(US_CITIES, draws.below(11, len(US_CITIES)))
    state = _take(US_STATES, draws.below(12, len(US_STATES)))
    size = 8 + sum(_string_lengths(column) for column in (name, email, card, city, state))
    extra = _padding(seed, draws, 13, size, config.avg_person_bytes)
    ids = last_person(config, numbers) + FIRST_PERSON_ID
    return pa.Table.from_arrays(
        [pa.array(ids, pa.int64()), name, email, card, city, state,
         _timestamps(event_time_ms(config, numbers)), extra], schema=PERSON_SCHEMA)


@functools.lru_cache(maxsize=1)
def _full_names() -> pa.Array:
    return pa.array([f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES], pa.string())


def _credit_cards(draws: _Draws, slot: int, n: int) -> pa.Array:
    """Four space-separated groups of four digits."""
    digits = np.empty((n, 19), dtype=np.uint8)
    digits[:, [4, 9, 14]] = ord(" ")
    for group in range(4):
        value = draws.below(slot + group, 10_000)
        for place in range(4):
            digits[:, group * 5 + 3 - place] = ord("0") + value % 10
            value = value // 10
    offsets = np.arange(n + 1, dtype=np.int64) * 19
    return _string_array(offsets, digits.reshape(-1))


def _auctions(config: NexmarkConfig, numbers: np.ndarray) -> pa.Table:
    draws = _Draws(config.seed, numbers)
    seed = config.seed
    latest_person = last_person(config, numbers)
    seller = np.where(_is_hot(draws, 20, config.hot_sellers_ratio),
                      latest_person // HOT_BLOCK * HOT_BLOCK,
                      _some_person(config, draws, 21, numbers)) + FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + draws.below(22, NUM_CATEGORIES)
    initial_bid = _prices(draws, 23)
    reserve = initial_bid + _prices(draws, 29)
    now = event_time_ms(config, numbers)
    # Auctions last twice, on average, the time it takes to open num_in_flight_auctions more.
    events_ahead = config.num_in_flight_auctions * config.total_proportion // config.auction_proportion
    horizon = event_time_ms(config, numbers + events_ahead) - now
    expires = now + 1 + draws.below(24, np.maximum(2 * horizon, 1))
    item_name = _words(seed, draws, 25, 20)
    description = _words(seed, draws, 27, 100)
    size = 8 + _string_lengths(item_name) + _string_lengths(description) + 40
    extra = _padding(seed, draws, 30, size, config.avg_auction_bytes)
    ids = last_auction(config, numbers) + FIRST_AUCTION_ID
    return pa.Table.from_arrays(
        [pa.array(ids, pa.int64()), item_name, description, pa.array(initial_bid, pa.int64()),
         pa.array(reserve, pa.int64()), _timestamps(now), _timestamps(expires),
         pa.array(seller, pa.int64()), pa.array(category, pa.int64()), extra], schema=AUCTION_SCHEMA)


@functools.lru_cache(maxsize=8)
def _channels(seed: int) -> tuple[pa.Array, pa.Array]:
    """The hot channels followed by channel-0 .. channel-9999, and a fixed URL for each."""
    names = list(HOT_CHANNELS) + [f"channel-{i}" for i in range(NUM_CHANNELS)]
    urls = []
    for i in range(len(names)):
        key = _mix_int(seed * _GOLDEN + 0xC4A77E1 + i * 0xD1B54A32D192ED03)
        segments = []
        for part in range(3):
            key = _mix_int(key + part + 1)
            length = 3 + key % 2
            segments.append("".join("_" if (key >> (8 + 6 * c)) % 13 == 0 else chr(97 + (key >> (11 + 6 * c)) % 26)
                                    for c in range(length)))
        url = "https://www.nexmark.com/" + "/".join(segments) + "/item.htm?query=1"
        channel = i - len(HOT_CHANNELS)
        if channel >= 0 and _mix_int(key + 7) % 10 > 0:
            reversed_bits = int(f"{channel:032b}"[::-1], 2)
            url += f"&channel_id={abs(reversed_bits - (1 << 32) if reversed_bits >= 1 << 31 else reversed_bits)}"
        urls.append(url)
    return pa.array(names, pa.string()), pa.array(urls, pa.string())


def _bids(config: NexmarkConfig, numbers: np.ndarray) -> pa.Table:
    draws = _Draws(config.seed, numbers)
    latest_auction = last_auction(config, numbers)
    auction = np.where(_is_hot(draws, 40, config.hot_auction_ratio),
                       latest_auction // HOT_BLOCK * HOT_BLOCK,
                       _some_auction(config, draws, 41, numbers)) + FIRST_AUCTION_ID
    # The second person of the hot block, so that hot bidders are not the hot sellers.
    bidder = np.where(_is_hot(draws, 42, config.hot_bidders_ratio),
                      last_person(config, numbers) // HOT_BLOCK * HOT_BLOCK + 1,
                      _some_person(config, draws, 43, numbers)) + FIRST_PERSON_ID
    price = _prices(draws, 44)
    channel_index = np.where(draws.below(45, 2) > 0, draws.below(46, len(HOT_CHANNELS)),
                             len(HOT_CHANNELS) + draws.below(47, NUM_CHANNELS))
    channel_names, channel_urls = _channels(config.seed)
    extra = _padding(config.seed, draws, 48, np.full(len(numbers), 32, dtype=np.int64), config.avg_bid_bytes)
    return pa.Table.from_arrays(
        [pa.array(auction, pa.int64()), pa.array(bidder, pa.int64()), pa.array(price, pa.int64()),
         _take(channel_names, channel_index), _take(channel_urls, channel_index),
         _timestamps(event_time_ms(config, numbers)), extra], schema=BID_SCHEMA)


class NexmarkGenerator:
    """Events by number: `events(first, count)` is a pure function of the config, so any
    range can be regenerated (after a restore, on another executor) and comes out the same."""

    def __init__(self, config: NexmarkConfig | None = None):
        self.config = config or NexmarkConfig()

    def events(self, first: int, count: int) -> NexmarkEvents:
        """Events first .. first + count - 1, split by stream."""
        if first < 0 or count < 0:
            raise ValueError(f"nexmark events need a first event >= 0 and a count >= 0, got {first} and {count}")
        parts = [self._slice(start, min(_SLICE, first + count - start))
                 for start in range(first, first + count, _SLICE)] or [self._slice(first, 0)]
        return NexmarkEvents(*(pa.concat_tables([part.stream(name) for part in parts])
                               for name in ("person", "auction", "bid")))

    def chunks(self, first: int = 0, count: int | None = None,
               chunk_events: int = _SLICE) -> Iterator[NexmarkEvents]:
        """Successive ranges of `chunk_events` events from `first`: `count` events in all,
        or without end when `count` is None (an unbounded stream)."""
        if chunk_events < 1:
            raise ValueError(f"chunk_events must be at least 1, got {chunk_events}")
        start = first
        while count is None or start < first + count:
            size = chunk_events if count is None else min(chunk_events, first + count - start)
            yield self.events(start, size)
            start += size

    def _slice(self, first: int, count: int) -> NexmarkEvents:
        numbers = np.arange(first, first + count, dtype=np.int64)
        kind = kinds(self.config, numbers)
        return NexmarkEvents(_people(self.config, numbers[kind == 0]),
                             _auctions(self.config, numbers[kind == 1]),
                             _bids(self.config, numbers[kind == 2]))


STREAMS = ("person", "auction", "bid")


def write_parquet(directory: str, events: int, config: NexmarkConfig | None = None,
                  files_per_stream: int = 1, chunk_events: int = _SLICE) -> dict[str, int]:
    """Write events 0 .. events - 1 to `directory/person/`, `directory/auction/` and
    `directory/bid/` as Parquet, `files_per_stream` files each (part-00000.parquet, ...):
    file k holds the k-th contiguous range of event numbers, so reading the files in name
    order reads each stream in event-time order. Returns the row count per stream."""
    if events < 0:
        raise ValueError(f"the number of nexmark events must be >= 0, got {events}")
    if files_per_stream < 1:
        raise ValueError(f"files per stream must be at least 1, got {files_per_stream}")
    for stream in STREAMS:
        target = os.path.join(directory, stream)
        if os.path.isdir(target) and os.listdir(target):
            raise FileExistsError(f"{target} is not empty: choose a new output directory or delete it first")
    generator = NexmarkGenerator(config)
    rows = dict.fromkeys(STREAMS, 0)
    for stream in STREAMS:
        os.makedirs(os.path.join(directory, stream), exist_ok=True)
    for part in range(files_per_stream):
        first, end = events * part // files_per_stream, events * (part + 1) // files_per_stream
        writers = {stream: pq.ParquetWriter(os.path.join(directory, stream, f"part-{part:05d}.parquet"),
                                            SCHEMAS[stream]) for stream in STREAMS}
        try:
            for chunk in generator.chunks(first, end - first, chunk_events):
                for stream in STREAMS:
                    table = chunk.stream(stream)
                    if table.num_rows:
                        writers[stream].write_table(table)
                        rows[stream] += table.num_rows
        finally:
            for writer in writers.values():
                writer.close()
    return rows
