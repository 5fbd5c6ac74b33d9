"""How the runtime names a failure that ends an attempt of the job."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from sparkpoint.errors import SparkpointError

# The participant id of the job itself (epoch, watermark) in every checkpoint.
JOB = "job"


class FailoverRequired(SparkpointError):
    pass


class RestoreFailed(SparkpointError):
    pass


def summarize(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    # Py4J errors carry the Python traceback of the worker; the last line names the cause.
    for line in reversed(text):
        if "Error" in line or "Exception" in line:
            return line.strip()[:400]
    return (text[-1] if text else type(e).__name__)[:400]


_TRACEBACK = "Traceback (most recent call last):"
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")


@dataclass(frozen=True)
class PythonFailure:
    """The Python exception inside a failure, as far as its text tells: user code that
    raised on an executor reaches the driver as Py4J/PythonException text."""
    type_name: str  # as printed: "ValueError", "sparkpoint.errors.ConfigError"
    message: str
    notes: tuple[str, ...] = ()

    @property
    def short_type(self) -> str:
        return self.type_name.rsplit(".", 1)[-1]

    def line(self) -> str:
        return f"{self.short_type}: {self.message}" if self.message else self.short_type


def python_failure(e: BaseException) -> PythonFailure:
    """The innermost Python exception of `e`: the last traceback's exception line when
    the error carries a worker's traceback (chained exceptions print the final one
    last), else `e` itself. Notes (`add_note`, e.g. the key being processed) follow
    the exception line in a traceback and are kept."""
    lines = str(e).splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().endswith(_TRACEBACK)]
    if starts:
        for i in range(starts[-1] + 1, len(lines)):
            line = lines[i]
            if not line or line[0].isspace():
                continue  # frames and source lines are indented
            m = _EXC_LINE.match(line.rstrip())
            if m is None:
                continue
            notes: list[str] = []
            for rest in lines[i + 1:]:
                # Spark appends its SQLSTATE and Java frames after the Python text.
                if not rest.strip() or rest.lstrip().startswith(("SQLSTATE", "at ")) or rest.startswith("\t"):
                    break
                if rest.startswith(("org.apache.", "py4j.", "java.")):
                    break
                notes.append(rest.strip())
            return PythonFailure(m.group(1), (m.group(2) or "").strip(), tuple(notes))
    cause = e
    while cause.__cause__ is not None and not isinstance(cause, SparkpointError):
        cause = cause.__cause__
    text = str(cause).strip().splitlines()
    return PythonFailure(f"{type(cause).__module__}.{type(cause).__qualname__}", text[0] if text else "")


def is_config_error(failure: PythonFailure) -> bool:
    """A ConfigError (or a subclass) raised anywhere, executors included: restarting
    cannot fix a wrong setting or a misdeclared operator."""
    module, _, name = failure.type_name.rpartition(".")
    if not module.startswith("sparkpoint"):
        return False
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    from sparkpoint.errors import ConfigError

    return isinstance(cls, type) and issubclass(cls, ConfigError)


@dataclass(frozen=True)
class FailureSignature:
    """What makes two failures "the same": a deterministic failure of user code on the
    same input, after restoring the same checkpoint, raises the same exception again."""
    type_name: str
    message: str
    operator: str | None
    restored_from: int | None


def failure_signature(e: BaseException, operator: str | None, restored_from: int | None) -> FailureSignature:
    failure = python_failure(e)
    # Messages that embed an epoch, stage or task number differ on every attempt
    # although the cause is the same; digits inside words and numbers stay.
    message = re.sub(r"\b(stage|epoch|TID|task) [\d.]+", r"\1 N", failure.message)
    return FailureSignature(failure.type_name, message, operator, restored_from)
