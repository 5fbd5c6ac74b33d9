"""At start on a cluster master the job waits for a first executor; one that never comes
(executors that cannot reach the driver) stops the job with one line saying what to set.
A fake session and a manual clock: the real case runs in tests/cluster."""

from __future__ import annotations

import pytest

from sparkpoint.runtime.spark import ExecutorsUnreachableError, await_executors


class _Size:
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


class FakeSession:
    def __init__(self, conf, registered_after=None, stopped=False):
        self.conf_values = conf
        self.registered_after = registered_after
        self.stopped = stopped
        self.polls = 0
        outer = self

        class Conf:
            def get(self, key, default=None):
                return outer.conf_values.get(key, default)

        class ScalaContext:
            def getExecutorMemoryStatus(self):
                outer.polls += 1
                registered = outer.registered_after is not None and outer.polls > outer.registered_after
                return _Size(2 if registered else 1)

            def isStopped(self):
                return outer.stopped

        class Context:
            _jsc = type("J", (), {"sc": lambda self: ScalaContext()})()

            def getConf(self):
                return Conf()

        self.conf = Conf()
        self.sparkContext = Context()


class ManualClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


CLUSTER = {"spark.master": "spark://10.0.0.5:7077", "spark.driver.host": "172.17.0.3", "spark.driver.port": "40123"}


def test_no_executor_within_the_timeout_is_one_line_naming_the_driver_address():
    clock = ManualClock()
    with pytest.raises(ExecutorsUnreachableError) as e:
        await_executors(FakeSession(CLUSTER), 30_000, clock=clock, sleep=clock.sleep)
    line = str(e.value)
    assert "\n" not in line and clock.now == pytest.approx(30, abs=1)
    assert "no executor registered with the driver within 30 s" in line
    assert "spark://10.0.0.5:7077" in line and "172.17.0.3:40123" in line
    assert "spark.conf.spark.driver.host" in line


def test_an_application_spark_stopped_before_any_executor_came_says_so():
    clock = ManualClock()
    with pytest.raises(ExecutorsUnreachableError, match="Spark stopped the application before any executor"):
        await_executors(FakeSession(CLUSTER, stopped=True), 30_000, clock=clock, sleep=clock.sleep)


def test_an_executor_that_registers_in_time_lets_the_job_start():
    clock = ManualClock()
    await_executors(FakeSession(CLUSTER, registered_after=5), 30_000, clock=clock, sleep=clock.sleep)
    assert clock.now < 30


@pytest.mark.parametrize("conf", [{"spark.master": "local[2]"},
                                  {**CLUSTER, "spark.dynamicAllocation.enabled": "true"}])
def test_local_masters_and_dynamic_allocation_do_not_wait(conf):
    clock = ManualClock()
    session = FakeSession(conf)
    await_executors(session, 30_000, clock=clock, sleep=clock.sleep)
    assert session.polls == 0 and clock.now == 0
