"""Finding the user's exception in the text Spark hands back."""

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


# What a Py4JJavaError prints for a read error on the driver: the Java chain only, no Python
# traceback of a worker; the Py4J object id and the stage numbers change on every attempt.
JAVA = """An error occurred while calling o{oid}.getResult.
: org.apache.spark.SparkException: Exception thrown in awaitResult: 
\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:53)
\tat org.apache.spark.security.SocketAuthServer.getResult(SocketAuthServer.scala:110)
Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage {stage}.0 failed 1 times, most recent failure: Lost task 0.0 in stage {stage}.0 (TID {tid}) (localhost executor driver): org.apache.spark.SparkException: [FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH] Encountered error while reading file file:///data/in/a.parquet. Data type mismatches when reading Parquet column [ts]. Expected Spark type timestamp, actual Parquet type INT64. SQLSTATE: KD001
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.parquetColumnDataTypeMismatchError(QueryExecutionErrors.scala:864)
Caused by: org.apache.spark.SparkException: [FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH] Encountered error while reading file file:///data/in/a.parquet. Data type mismatches when reading Parquet column [ts]. Expected Spark type timestamp, actual Parquet type INT64. SQLSTATE: KD001
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.parquetColumnDataTypeMismatchError(QueryExecutionErrors.scala:864)
\t... 21 more
Caused by: org.apache.spark.sql.execution.datasources.SchemaColumnConvertNotSupportedException: column: [ts], physicalType: INT64, logicalType: timestamp
\tat org.apache.spark.sql.execution.datasources.parquet.ParquetVectorUpdaterFactory.getUpdater(ParquetVectorUpdaterFactory.java:87)
"""


def test_a_java_failure_is_named_by_its_exception_class_and_error_condition_not_the_py4j_call() -> None:
    first = Py4JLike(JAVA.format(oid=153, stage=3, tid=5))
    again = Py4JLike(JAVA.format(oid=245, stage=7, tid=11))
    failure = python_failure(first)
    assert failure.type_name == "org.apache.spark.SparkException"
    assert failure.line() == ("SparkException: [FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH] Encountered "
                              "error while reading file file:///data/in/a.parquet. Data type mismatches when reading "
                              "Parquet column [ts]. Expected Spark type timestamp, actual Parquet type INT64.")
    assert failure_signature(first, None, None) == failure_signature(again, None, None)


def test_a_java_failure_without_an_error_condition_is_named_by_its_innermost_cause() -> None:
    text = ("An error occurred while calling o12.toArrow.\n: java.lang.RuntimeException: outer\n"
            "\tat a.b.C.d(C.java:1)\nCaused by: java.io.FileNotFoundException: /data/in/gone.json (No such file)\n"
            "\tat a.b.C.d(C.java:2)\n")
    assert python_failure(Py4JLike(text)).line() == "FileNotFoundException: /data/in/gone.json (No such file)"


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001 - the traceback is the point
        return e


def test_only_failures_of_the_pipeline_itself_may_count_as_permanent() -> None:
    from sparkpoint.errors import StorageError
    from sparkpoint.runtime.failures import may_be_permanent

    user = Py4JLike(WORKER.format(exc="ValueError: cannot handle key 7"))
    assert may_be_permanent(user)
    assert may_be_permanent(Py4JLike(JAVA.format(oid=1, stage=1, tid=1)))
    # Checkpoint storage, on the driver or in a worker, and a JVM that is gone are not.
    assert not may_be_permanent(_raised(StorageError("injected fault: read ck/job/chk-3/_metadata")))
    assert not may_be_permanent(Py4JLike(WORKER.format(exc="sparkpoint.errors.StorageError: injected fault: read")))
    assert not may_be_permanent(_raised(ConnectionRefusedError(111, "Connection refused")))
    assert not may_be_permanent(_raised(EOFError()))
    from sparkpoint.runtime.failures import FailoverRequired

    assert not may_be_permanent(_raised(FailoverRequired("tolerable failed checkpoints exceeded (3); last: "
                                                         "IO_EXCEPTION")))
    # An OSError raised by the user's own code (a frame outside the runtime's packages) is the
    # pipeline's; raised inside Spark's or the runtime's I/O it is not.
    assert may_be_permanent(Py4JLike(WORKER.format(exc="FileNotFoundError: [Errno 2] /lookup.csv")))


STEP = """An error occurred while calling o345.toArrow.
: org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/work/main/sparkpoint/runtime/stage.py", line 93, in apply_subtask
    yield from task.run(order[TaskContext.get().partitionId()], table).to_batches()
  File "/work/main/sparkpoint/runtime/executor/subtask.py", line 180, in run
    out_rows, handles = self.output(self.epoch, subtask, out)
  File "/work/main/sparkpoint/runtime/executor/subtask.py", line 74, in __call__
    return None, list(self.writer.write(epoch, part, self.map(out)))
  File "/work/main/sparkpoint/runtime/executor/subtask.py", line 79, in map
    out = fn(out)
          ^^^^^^^
  File "/tmp/p/pipe.py", line 12, in add_label
    raise KeyError("label")
KeyError: 'label'
"""


def test_a_failure_in_a_map_output_step_names_that_step_not_the_operator() -> None:
    from sparkpoint.runtime.failures import failing_step

    assert failing_step(Py4JLike(STEP), "totals") == "map_output step 'add_label'"
    assert failing_step(Py4JLike(WORKER.format(exc="ValueError: x")), "totals") == "operator 'totals'"
    assert failing_step(Py4JLike(JAVA.format(oid=1, stage=1, tid=1)), "totals") is None
