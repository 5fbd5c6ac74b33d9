"""Code that runs inside Spark's executors (Python workers), never on the driver.

It is shipped with each epoch's tasks and must not import pyspark at module level.
Everything it needs arrives in the task (`EpochTask`); everything it reports goes
back in one small meta row per task. State files move only between the executor's
local disk and checkpoint storage: the driver never opens one.
"""
