"""Aggregate calls written as Spark SQL: `"count(*) FILTER (WHERE price < 10000) AS rank1"`.

Only the outer call is read here: the function name, DISTINCT, the argument list, the
FILTER clause and the alias. Arguments and conditions stay Spark SQL text that Spark
itself parses and evaluates (`F.expr`) when it pre-aggregates an epoch, so any column
expression Spark accepts works, with Spark's own error for a bad one. Why not walk the
tree Spark's parser builds: that is the JVM's internal Catalyst API, reached through
py4j and absent under Spark Connect; the outer call's grammar is small and stable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkpoint.errors import ConfigError

# Spark's names (and aliases) -> the function computed.
_FUNCTIONS = {
    "count": "count", "sum": "sum", "avg": "avg", "mean": "avg", "min": "min", "max": "max",
    "approx_count_distinct": "approx_count_distinct", "first": "first", "first_value": "first",
    "last": "last", "last_value": "last", "collect_list": "collect_list", "array_agg": "collect_list",
    "collect_set": "collect_set", "percentile_approx": "percentile_approx",
    "approx_percentile": "percentile_approx",
}
SUPPORTED = sorted(set(_FUNCTIONS) - {"mean", "first_value", "last_value", "array_agg", "approx_percentile"}) \
    + ["count(DISTINCT ...)"]
_COLUMN = re.compile(r"^\s*(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)\s*$")
_NUMBER = re.compile(r"^\s*[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?[dD]?\s*$")


@dataclass(frozen=True)
class AggCall:
    """One aggregate: `func` over `args` (Spark SQL; none for count(*)), counting only
    rows where `condition` (Spark SQL) is true, output as `alias`."""

    func: str
    args: tuple[str, ...]
    condition: str | None
    alias: str
    text: str
    percentages: tuple[float, ...] = ()
    percentage_is_array: bool = False
    ignore_nulls: bool = False

    @property
    def arg(self) -> str | None:
        return self.args[0] if self.args else None

    def arg_column(self, i: int = 0) -> str | None:
        """The column name when argument `i` is a plain column reference, else None."""
        m = _COLUMN.match(self.args[i]) if len(self.args) > i else None
        return m.group(1).strip("`") if m else None

    def condition_column(self) -> str | None:
        m = _COLUMN.match(self.condition) if self.condition else None
        return m.group(1).strip("`") if m else None


def parse_agg(text: str, what: str) -> AggCall:
    """Parse `func([DISTINCT] args) [FILTER (WHERE cond)] [[AS] alias]`. Raises one
    ConfigError line naming `what`, the text and what is wrong."""
    def fail(why: str) -> ConfigError:
        return ConfigError(f"{what}: aggregate {text!r} {why}; write it as Spark SQL, e.g. "
                           "\"count(*) FILTER (WHERE price < 10000) AS cheap_bids\"")

    if not isinstance(text, str):
        raise ConfigError(f"{what}: aggregates are Spark SQL strings such as 'sum(price) AS total', got "
                          f"{type(text).__name__}")
    m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(", text)
    if not m:
        raise fail("does not start with a function call")
    name = m.group(1).lower()
    if name not in _FUNCTIONS:
        raise fail(f"calls {m.group(1)}(), which is not one of the supported aggregates {SUPPORTED}")
    close = _matching(text, m.end() - 1)
    if close is None:
        raise fail("has unbalanced parentheses or quotes")
    inner = text[m.end():close].strip()
    rest = text[close + 1:]
    distinct = bool(re.match(r"(?i)DISTINCT\b", inner))
    if distinct:
        inner = inner[len("DISTINCT"):].strip()
    args = tuple(a.strip() for a in _split_top(inner)) if inner else ()
    condition = None
    f = re.match(r"(?i)\s*FILTER\s*\(\s*WHERE\b", rest)
    if f:
        open_at = rest.index("(", 0)
        end = _matching(rest, open_at)
        if end is None:
            raise fail("has an unbalanced FILTER clause")
        condition = rest[f.end():end].strip()
        if not condition:
            raise fail("has an empty FILTER (WHERE ...) condition")
        rest = rest[end + 1:]
    alias = None
    if rest.strip():
        a = re.match(r"(?i)\s*(?:AS\s+)?(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)\s*$", rest)
        if not a:
            raise fail(f"has {rest.strip()!r} after the call, where only FILTER (WHERE ...) and AS name may follow")
        alias = a.group(1).strip("`")
    func = _FUNCTIONS[name]
    call = _build(func, args, distinct, condition, fail)
    default = re.sub(r"\s+", " ", text[:close + 1].strip() if f is None else text[:len(text) - len(rest)].strip())
    return AggCall(call.func, call.args, condition, alias or default, text, call.percentages,
                   call.percentage_is_array, call.ignore_nulls)


def _build(func: str, args: tuple[str, ...], distinct: bool, condition: str | None, fail) -> AggCall:
    def arity(lo: int, hi: int) -> None:
        if not lo <= len(args) <= hi:
            raise fail(f"gives {func} {len(args)} argument(s), it takes {lo}" + (f" to {hi}" if hi > lo else ""))

    if func == "count":
        if distinct:
            arity(1, 1)
            return AggCall("count_distinct", args, condition, "", "")
        arity(1, 1)
        if args[0] == "*" or _NUMBER.match(args[0]):  # count(*), count(1): rows
            return AggCall("count_rows", (), condition, "", "")
        return AggCall("count", args, condition, "", "")
    if distinct and func in ("sum", "avg", "collect_list", "percentile_approx", "first", "last"):
        raise fail(f"uses {func}(DISTINCT ...), which is not supported (count(DISTINCT ...) is)")
    if func in ("sum", "avg", "min", "max", "collect_list", "collect_set"):
        arity(1, 1)
        return AggCall(func, args, condition, "", "")
    if func == "approx_count_distinct":
        arity(1, 2)  # the relative error: the count kept here is exact
        return AggCall(func, args[:1], condition, "", "")
    if func in ("first", "last"):
        arity(1, 2)
        ignore = len(args) == 2 and args[1].strip().lower() == "true"
        if len(args) == 2 and args[1].strip().lower() not in ("true", "false"):
            raise fail(f"gives {func} the ignoreNulls argument {args[1]!r}; it must be true or false")
        return AggCall(func, args[:1], condition, "", "", ignore_nulls=ignore)
    if func == "percentile_approx":
        arity(2, 3)
        p = args[1].strip()
        arr = re.match(r"(?i)^array\s*\((.*)\)$", p)
        items = [x.strip() for x in _split_top(arr.group(1))] if arr else [p]
        if not items or not all(_NUMBER.match(x) for x in items):
            raise fail(f"gives percentile_approx the percentage {p!r}; it must be a number or array(numbers)")
        ps = tuple(float(x.rstrip("dD")) for x in items)
        if not all(0.0 <= x <= 1.0 for x in ps):
            raise fail(f"gives percentile_approx the percentage {p!r}; each must be between 0 and 1")
        return AggCall(func, args[:1], condition, "", "", percentages=ps, percentage_is_array=bool(arr))
    raise fail("is not supported")  # pragma: no cover - every name above is handled


def _unquoted(text: str, start: int = 0):
    """(index, character, depth) of each character of `text` from `start` that is outside
    quotes; depth counts the parentheses open before it (an opening one included)."""
    depth, quote, i = 0, None, start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote != "`":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
        else:
            depth += (c == "(") - (c == ")")
            yield i, c, depth
        i += 1


def _matching(text: str, open_at: int) -> int | None:
    """Index of the parenthesis closing the one at `open_at` (quotes respected)."""
    return next((i for i, c, depth in _unquoted(text, open_at) if c == ")" and depth == 0), None)


def _split_top(text: str) -> list[str]:
    """`text` split at commas outside parentheses and quotes."""
    cuts = [i for i, c, depth in _unquoted(text) if c == "," and depth == 0]
    return [text[a + 1:b] for a, b in zip([-1, *cuts], [*cuts, len(text)])]
