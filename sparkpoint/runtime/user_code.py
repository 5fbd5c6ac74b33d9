"""Ship the user's own classes to Spark's Python workers.

Spark pickles functions and objects with cloudpickle, by reference when their
module is importable. A StatefulProcessor defined in a pipeline file (loaded by
`sparkpoint run`) or in a test module is not importable in the workers, so we ask
cloudpickle to ship such modules by value. This is code travelling from the
driver to its own workers — never data read back from checkpoint storage."""

from __future__ import annotations

import inspect
import sys
from typing import Any

_IMPORTABLE_ROOTS = ("sparkpoint", "pyspark", "pyarrow", "pandas", "numpy", "builtins")


def _module_of(obj: Any):
    target = obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)
    return sys.modules.get(getattr(target, "__module__", "") or "")


def ship_by_value(*objs: Any) -> None:
    from pyspark import cloudpickle

    for obj in objs:
        if obj is None:
            continue
        module = _module_of(obj)
        if module is None or module.__name__ == "__main__":
            continue  # __main__ is pickled by value already
        if module.__name__.split(".")[0] in _IMPORTABLE_ROOTS:
            continue
        file = getattr(module, "__file__", "") or ""
        if "site-packages" in file:
            continue  # an installed package: importable in the workers too
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:
            pass  # already registered
