"""Finding the user's exception in the text Spark hands back (issue 12.1)."""

from __future__ import annotations

from sparkpoint.errors import ConfigError
from sparkpoint.runtime.failures import failure_signature, is_config_error, python_failure

WORKER = """An error occurred while calling o345.toArrow.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 7.0 failed 1 times
org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call last):
  File "/work/main/sparkpoint/runtime/stage.py", line 93, in apply_subtask
    return task(table)
           ^^^^^^^^^^^
  File "/tmp/rp/boom.py", line 10, in handleInputRows
    raise ValueError(f"cannot handle key {{key[0]}}")
{exc}
 SQLSTATE: 38000
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1097)
"""


class Py4JLike(Exception):
    pass


def test_the_python_exception_of_a_worker_traceback_is_found() -> None:
    failure = python_failure(Py4JLike(WORKER.format(exc="ValueError: cannot handle key 7")))
    assert (failure.type_name, failure.message, failure.notes) == ("ValueError", "cannot handle key 7", ())
    assert failure.line() == "ValueError: cannot handle key 7"


def test_a_bare_exception_and_notes_are_kept() -> None:
    failure = python_failure(Py4JLike(WORKER.format(exc="AssertionError\nwhile processing key (7,)")))
    assert failure.type_name == "AssertionError" and failure.message == ""
    assert failure.notes == ("while processing key (7,)",)


def test_chained_exceptions_name_the_last_one() -> None:
    chained = WORKER.format(exc="KeyError: 'a'\n\nDuring handling of the above exception, another exception "
                                "occurred:\n\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                                "sparkpoint.errors.ConfigError: bad declaration")
    failure = python_failure(Py4JLike(chained))
    assert failure.type_name == "sparkpoint.errors.ConfigError" and is_config_error(failure)
    assert not is_config_error(python_failure(Py4JLike(WORKER.format(exc="ValueError: x"))))


def test_a_driver_side_exception_is_its_own_failure() -> None:
    failure = python_failure(ConfigError("state.local.dir is a file"))
    assert failure.type_name == "sparkpoint.errors.ConfigError" and is_config_error(failure)


def test_the_same_failure_on_another_stage_is_the_same_and_another_checkpoint_is_not() -> None:
    a = Py4JLike(WORKER.format(exc="ValueError: bad row in stage 7.0"))
    b = Py4JLike(WORKER.format(exc="ValueError: bad row in stage 9.0"))
    assert failure_signature(a, "op", 3) == failure_signature(b, "op", 3)
    assert failure_signature(a, "op", 3) != failure_signature(a, "op", 4)
    assert failure_signature(a, "op", 3) != failure_signature(Py4JLike(WORKER.format(exc="ValueError: other")), "op", 3)
