"""The long-lived objects of a Python worker leave the garbage collector's reach.

PySpark's daemon runs `gc.collect()` in a reused Python worker after every task. A full
collection walks every object the process tracks, and once pyarrow, pandas and sparkpoint
are imported that is about 100,000 objects: tens of milliseconds per task, which was most
of a small epoch's Python CPU (bench/observations.md, 2026-11-27 evening).

Almost all of those objects are modules, classes and functions, alive until the worker
exits. `gc.freeze()` moves every tracked object into a permanent generation that
collections skip; objects whose reference count drops to zero are still freed. So each
task start freezes the heap whenever modules were imported since the last freeze: at that
moment the daemon's collection has just run, so what gets frozen is live. A frozen object
that later becomes part of an unreachable cycle is never collected; that happens only to the
few objects alive when modules were first imported, a bounded once-per-import cost.
"""

from __future__ import annotations

import gc
import sys
import threading

_lock = threading.Lock()
_modules_at_last_freeze = -1


def freeze_long_lived_objects() -> bool:
    """Freeze the heap of this Spark Python worker if modules were imported since the
    last freeze. Call at the start of a Spark task's Python function. Returns whether it
    froze; does nothing outside a Spark task (a test or tool calling a task function in
    its own process keeps its collector as it was)."""
    global _modules_at_last_freeze
    if len(sys.modules) == _modules_at_last_freeze or not in_spark_task():
        return False
    with _lock:
        if len(sys.modules) == _modules_at_last_freeze:
            return False
        gc.freeze()
        _modules_at_last_freeze = len(sys.modules)
        return True


def in_spark_task() -> bool:
    """Whether this process runs a Spark task now, as a Spark Python worker does. A
    process that never imported pyspark runs none, and the processor tester must not pay
    pyspark's import for the answer."""
    if "pyspark" not in sys.modules:
        return False
    from pyspark import TaskContext

    return TaskContext.get() is not None
