"""How the runtime names a failure that ends an attempt of the job."""

from __future__ import annotations

import importlib
import re
import traceback
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
    """The innermost exception of `e` that names the cause: the last traceback's
    exception line when the error carries a worker's traceback (chained exceptions
    print the final one last); else, for an error of the JVM (Py4J), the Java
    exception that carries Spark's error condition (`[FAILED_READ_FILE...]`), or the
    innermost Java cause; else `e` itself. Notes (`add_note`, e.g. the key being
    processed) follow the exception line in a traceback and are kept."""
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
    java = _java_failure(lines)
    if java is not None:
        return java
    cause = e
    while cause.__cause__ is not None and not isinstance(cause, SparkpointError):
        cause = cause.__cause__
    text = str(cause).strip().splitlines()
    return PythonFailure(f"{type(cause).__module__}.{type(cause).__qualname__}", text[0] if text else "")


# "java.io.IOException: msg" / "org.apache.spark.SparkException: [COND] msg", as the head
# of a Py4J error (": ..."), a "Caused by: ..." line, or embedded after Spark's
# "most recent failure: Lost task ... (executor driver): ".
_JAVA_EXC = re.compile(r"((?:java|javax|scala|org|com|io|py4j)\.[\w$.]*[A-Z][\w$]*(?:Exception|Error|Failure))"
                       r"(?::\s?(.*))?$")
_CONDITION = re.compile(r"^\[([A-Z][A-Z0-9_]*(?:\.[A-Z][A-Z0-9_]*)*)\]")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+\s*$")


def _java_failure(lines: list[str]) -> PythonFailure | None:
    """The Java exception of a Py4J error's text: the innermost one that carries an error
    condition, else the innermost cause. Read from the text, not from the JVM, which may
    be gone by now."""
    found: list[tuple[str, str]] = []
    for line in lines:
        head = line.strip()
        if head.startswith(": "):
            head = head[2:]
        elif head.startswith("Caused by: "):
            head = head[len("Caused by: "):]
        else:
            continue
        m = _JAVA_EXC.match(head)
        if m is None:
            continue
        name, message = m.group(1), (m.group(2) or "").strip()
        # Spark's stage-failure text embeds the task's own exception after the task.
        inner = re.search(r"\): ((?:java|javax|scala|org|com)\.\S+?(?:Exception|Error)):\s?(.*)$", message)
        found.append((name, message))
        if inner is not None:
            found.append((inner.group(1), inner.group(2).strip()))
    if not found:
        return None
    with_condition = [f for f in found if _CONDITION.match(f[1])]
    name, message = (with_condition or found)[-1]
    return PythonFailure(name, _SQLSTATE.sub("", message))


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


# Failures of the machinery around the pipeline (the JVM or a worker gone, a connection
# dropped): restarting is what fixes them, so they never count as "the same input fails".
_TRANSIENT_PYTHON = ("ConnectionError", "ConnectionRefusedError", "ConnectionResetError", "ConnectionAbortedError",
                     "BrokenPipeError", "EOFError", "TimeoutError", "Py4JNetworkError", "socket.timeout")
_OS_ERRORS = ("OSError", "IOError", "FileNotFoundError", "PermissionError", "IsADirectoryError",
              "NotADirectoryError", "FileExistsError", "InterruptedError", "BlockingIOError")
_TRANSIENT_JAVA = ("SparkContext was shut down", "stopped SparkContext", "ExecutorLostFailure",
                   "Python worker exited unexpectedly", "Connection reset", "Connection refused")
# Frames of these are the runtime's or a library's, not the pipeline's.
_RUNTIME_FRAMES = ("/sparkpoint/runtime/", "/sparkpoint/state/", "/sparkpoint/storage/", "/sparkpoint/checkpoint/",
                   "/sparkpoint/connectors/", "/sparkpoint/faults/", "/site-packages/", "/dist-packages/",
                   "/pyspark/", "/py4j/", "/fsspec/", "/lib/python3")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)')


def _frames(e: BaseException) -> list[tuple[str, str]]:
    """(file, function) of the frames that raised, innermost last: those of the last
    traceback in a worker's text when there is one, else of `e`'s own traceback."""
    lines = str(e).splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().endswith(_TRACEBACK)]
    if starts:
        return [(m.group(1), m.group(2)) for line in lines[starts[-1] + 1:] if (m := _FRAME.match(line))]
    cause = e
    while cause.__cause__ is not None:
        cause = cause.__cause__
    return [(f.filename, f.name) for f in traceback.extract_tb(cause.__traceback__)]


def _is_a(failure: PythonFailure, base: type) -> bool:
    module, _, name = failure.type_name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module or "builtins"), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, base)


def may_be_permanent(e: BaseException) -> bool:
    """Whether `e` can be the pipeline failing on its input (user code, a schema that
    does not fit the data), which the same-failure rule may count. Checkpoint storage,
    a dropped connection, a JVM or worker that is gone are not: they fail the same way
    until they heal, and a restart is what waits for that."""
    from sparkpoint.errors import StorageError

    failure = python_failure(e)
    short = failure.short_type
    if short in _TRANSIENT_PYTHON or _is_a(failure, StorageError) or short == "StorageError":
        return False
    if _is_a(failure, FailoverRequired):  # the runtime's own call: checkpoints failing, a final commit
        return False
    if failure.type_name.startswith(("java.", "org.", "scala.")) and any(t in failure.message or t in str(e)[:2000]
                                                                          for t in _TRANSIENT_JAVA):
        return False
    if short in _OS_ERRORS:  # the pipeline's own I/O, or the runtime's: the innermost frame tells
        frames = _frames(e)
        return bool(frames) and not any(part in frames[-1][0] for part in _RUNTIME_FRAMES)
    return True


def failing_step(e: BaseException, operator: str | None) -> str | None:
    """The pipeline step whose code raised, as the failure line names it: a map_output
    function (the frame `OutputStep.map` called), else the stateful operator when the
    failure came from its subtasks."""
    frames = _frames(e)
    for i, (file, function) in enumerate(frames[:-1]):
        if function == "map" and file.replace("\\", "/").endswith("runtime/executor/subtask.py"):
            return f"map_output step {frames[i + 1][1]!r}"
    if operator is not None and ("apply_subtask" in str(e) or operator in str(e)):
        return f"operator {operator!r}"
    return None


@dataclass(frozen=True)
class FailureSignature:
    """What makes two failures "the same": a deterministic failure of user code on the
    same input, after restoring the same checkpoint, raises the same exception again."""
    type_name: str
    message: str
    step: str | None  # `failing_step`
    restored_from: int | None


def failure_signature(e: BaseException, step: str | None, restored_from: int | None) -> FailureSignature:
    failure = python_failure(e)
    # Messages that embed an epoch, stage or task number differ on every attempt
    # although the cause is the same; digits inside words and numbers stay.
    message = re.sub(r"\b(stage|epoch|TID|task) [\d.]+", r"\1 N", failure.message)
    message = re.sub(r"\bo\d+\.", "oN.", message)  # a Py4J object id
    return FailureSignature(failure.type_name, message, step, restored_from)
