# Two entry points, both bootstrap everything on a fresh machine (Python 3.13 + Java 17;
# `make test` also needs Python 3.11, the oldest supported, for tests/packaging/):
#   make demo   run the demo pipeline on embedded local Spark (installs sparkpoint[spark] only)
#   make test   run the test suite
# Both install the exact known-good set in constraints.txt (`make lock` regenerates it).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The newest supported Python runs the whole suite; tests/packaging/test_wheel.py installs
# the built wheel on the oldest, next to the oldest PySpark and the lowest dependency bounds.
PYTHON_VERSION ?= 3.13
# The first interpreter that really is $(1): a pyenv shim on PATH may name a version it
# does not have selected, so pyenv's own install directories are asked as well.
find_python = $(shell for p in python$(1) $(wildcard $(HOME)/.pyenv/versions/$(1).*/bin/python$(1)); do \
	$$p -c 'import sys; assert "%d.%d" % sys.version_info[:2] == "$(1)"; print(sys.executable)' 2>/dev/null && break; done)
ifndef PYTHON
PYTHON := $(call find_python,$(PYTHON_VERSION))
endif
ifndef SPARKPOINT_OLDEST_PYTHON
SPARKPOINT_OLDEST_PYTHON := $(call find_python,3.11)
endif
export SPARKPOINT_OLDEST_PYTHON

.PHONY: demo test test-fast bootstrap check-java kafka-jars bench clean-demo docs chaos nexmark-kill9 lock

check-java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17 is required (Spark runs on the JVM). Install a JDK 17, e.g. 'apt-get install openjdk-17-jdk-headless', or put it on PATH." >&2; exit 1; }
	@java -version 2>&1 | head -1 | grep -Eq '"(1[7-9]|2[0-9])' || { echo "error: Java 17+ is required, found: $$(java -version 2>&1 | head -1)" >&2; exit 1; }

# A venv of another Python (an older checkout's) is rebuilt, not patched.
$(VENV)/.python-$(PYTHON_VERSION):
	@test -n "$(PYTHON)" || { echo "error: Python $(PYTHON_VERSION) is required (python$(PYTHON_VERSION) not found; or set PYTHON=/path/to/python$(PYTHON_VERSION))" >&2; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	touch $@

$(VENV)/.installed-test: $(VENV)/.python-$(PYTHON_VERSION) pyproject.toml constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e ".[spark,test]"
	touch $@

# The demo needs PySpark and the core dependencies only (GeneratorSource, ParquetSink).
$(VENV)/.installed-demo: $(VENV)/.python-$(PYTHON_VERSION) pyproject.toml constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e ".[spark]"
	touch $@

bootstrap: check-java $(VENV)/.installed-test

kafka-jars: bootstrap
	@command -v mvn >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && apt-get install -y -qq maven >/dev/null; else echo "error: mvn (Apache Maven) is needed once to fetch the Kafka broker jars from Maven Central; install it (apt-get install maven)" >&2; exit 1; fi; }
	bash scripts/fetch_kafka.sh

# The browser tests (dashboard, cross-site requests) drive /usr/bin/chromium; no test installs it.
.PHONY: chromium
chromium:
	@test -x /usr/bin/chromium || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; else echo "error: the browser tests need Chromium at /usr/bin/chromium; install it (apt-get install chromium)" >&2; exit 1; fi; }

demo: check-java $(VENV)/.installed-demo
	$(VENV)/bin/sparkpoint run examples/demo.py --config examples/demo.yaml

# The Spark driver JVMs of the run map their classes from one class-data archive, made
# here once per Java and PySpark (tests/servers/spark_cds.py): each start costs less.
.PHONY: spark-cds
spark-cds: bootstrap
	$(PY) -m tests.servers.spark_cds

# The tests that start a JVM: a SparkSession, a Kafka broker, a standalone cluster or a
# job process (tests/conftest.py marks each test from the fixtures it uses).
JVM_TESTS := spark or e2e or kafka or cluster or packaging
# They run in three pytest processes at once, so that each server still starts once per run:
# - the in-process tests, on a SparkSession of their own;
# - the tests of the Kafka broker and the S3 server (on a session of their own too), then
#   the in-process files of JVM_BESIDE_KAFKA on a new session;
# - the tests that start the cluster, a wheel's venv or other job processes, the files of
#   JVM_AFTER_JOBS last.
# With two processes (the servers' tests in one) the two cores were idle 17 % of the JVM
# tests' time, since every test JVM compiles with C1 only (vmstat, 2026-11-28).
JVM_SESSION := spark and not (e2e or kafka or cluster or packaging or s3)
JVM_KAFKA_S3 := kafka or (s3 and (spark or e2e))
JVM_JOBS := (e2e or cluster or packaging) and not (kafka or s3)
# In-process files run beside the Kafka tests and job-process files run last, so that the
# three processes take about as long.
JVM_BESIDE_KAFKA := tests/nexmark/test_examples.py tests/integration/test_bench_nexmark_spark_ss_rows.py \
	tests/integration/test_job_outcomes.py
JVM_AFTER_JOBS := tests/e2e/test_chaos.py tests/e2e/test_chaos_command.py

# Everything: first the tests that start no JVM on four pytest-xdist workers (they wait on
# servers and sleeps as much as they compute), then the three processes of the JVM tests
# side by side (the two in the background print their output when all are done). Every
# pass runs whatever the others' outcome; the slowest tests are printed at the end of each.
test: bootstrap kafka-jars chromium spark-cds
	@rc=0; \
	SPARKPOINT_TEST_TIMES=$(CURDIR)/.cache/test-times-no-jvm.json \
		$(PY) -m pytest -q -p no:cacheprovider -n 4 --durations=10 tests -m "not ($(JVM_TESTS))" || rc=$$?; \
	kafka_log=$(CURDIR)/.cache/test-jvm-kafka-s3.log; jobs_log=$(CURDIR)/.cache/test-jvm-jobs.log; \
	{ SPARKPOINT_TEST_TIMES=$(CURDIR)/.cache/test-times-jvm-kafka-s3.json \
		$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests -m "$(JVM_KAFKA_S3)"; a=$$?; \
	  SPARKPOINT_TEST_TIMES=$(CURDIR)/.cache/test-times-jvm-beside-kafka.json \
		$(PY) -m pytest -q -p no:cacheprovider --durations=10 $(JVM_BESIDE_KAFKA); b=$$?; \
	  exit $$(( a || b )); } > $$kafka_log 2>&1 & kafka=$$!; \
	{ SPARKPOINT_TEST_TIMES=$(CURDIR)/.cache/test-times-jvm-jobs.json \
		$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests -m "$(JVM_JOBS)" \
		$(addprefix --deselect ,$(JVM_AFTER_JOBS)); a=$$?; \
	  SPARKPOINT_TEST_TIMES=$(CURDIR)/.cache/test-times-jvm-after-jobs.json \
		$(PY) -m pytest -q -p no:cacheprovider --durations=5 $(JVM_AFTER_JOBS); b=$$?; \
	  exit $$(( a || b )); } > $$jobs_log 2>&1 & jobs=$$!; \
	SPARKPOINT_TEST_TIMES=$(CURDIR)/.cache/test-times-jvm-session.json \
		$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests -m "$(JVM_SESSION)" \
		$(addprefix --deselect ,$(JVM_BESIDE_KAFKA)) || rc=$$?; \
	wait $$kafka || rc=$$?; \
	wait $$jobs || rc=$$?; \
	echo "---- the tests of the Kafka broker and the S3 server, then in-process files (run alongside) ----"; \
	cat $$kafka_log; \
	echo "---- the tests of the cluster, the wheel and other job processes (run alongside) ----"; \
	cat $$jobs_log; \
	exit $$rc

# The tier that starts no JVM: unit tests, the contract suites of checkpoint storage and
# sinks (local, memory://, an S3 API), the Nexmark references and everything else that
# needs no SparkSession, Kafka broker, standalone cluster or job process. `make test`
# runs these first, then all the others.
test-fast: bootstrap
	$(PY) -m pytest -q -p no:cacheprovider -n 4 --durations=25 tests -m "not ($(JVM_TESTS))"

# `sparkpoint chaos --storm` over 20 seeds (SEEDS=N to change) on a Delta sink with checkpoints
# on an S3 API and on Kafka source and sink: every fault kind once per seed. The reports (runs,
# faults, rows lost and duplicated; expected 0) are printed at the end and kept in CHAOS_OUT.
SEEDS ?= 20
CHAOS_OUT ?= chaos-out
chaos: bootstrap kafka-jars spark-cds
	rm -rf $(CHAOS_OUT) && mkdir -p $(CHAOS_OUT)
	SPARKPOINT_CHAOS_SEEDS=$(SEEDS) SPARKPOINT_CHAOS_OUT=$(abspath $(CHAOS_OUT)) SPARKPOINT_CHAOS_FULL=1 \
		$(PY) -m pytest -q -p no:cacheprovider tests/e2e/test_chaos_storm.py tests/e2e/test_chaos_kafka_fallback.py; rc=$$?; \
		cat $(CHAOS_OUT)/*/chaos-report.md > $(CHAOS_OUT)/chaos-report.md 2>/dev/null; \
		cat $(CHAOS_OUT)/chaos-report.md; exit $$rc

# Every Nexmark example kill -9ed mid-run and run again to the end, its committed output
# compared with the pandas reference on the same events (scripts/nexmark_kill9.py):
# rows lost and duplicated per query (expected 0). NEXMARK_KILL9_EVENTS=N to change the input.
NEXMARK_KILL9_EVENTS ?= 100000
NEXMARK_KILL9_OUT ?= nexmark-kill9-out
nexmark-kill9: bootstrap
	rm -rf $(NEXMARK_KILL9_OUT)
	$(PY) scripts/nexmark_kill9.py --events $(NEXMARK_KILL9_EVENTS) --workdir $(NEXMARK_KILL9_OUT)

# The docs site with the API reference from the docstrings, into site/.
docs: bootstrap
	$(PY) -m pip install -q -c constraints.txt -e ".[docs]"
	$(PY) scripts/gen_config_keys.py
	$(VENV)/bin/mkdocs build --strict

# Every benchmark (W1 at 100k and 1M keys, W2, W3, latency, processor, Nexmark; PyFlink peer via
# bench/pyflink/setup.sh), then bench/RESULTS.md and bench/plots/*.png. ARGS passes options, e.g.
# make bench ARGS="--only w1,w2 --runs 3", ARGS="--only nexmark --nexmark-events 1000000" or ARGS="--more --runs 0" (re-render only).
bench: bootstrap
	$(PY) -m pip install -q -c constraints.txt -e ".[bench]"
	$(PY) bench/run_all.py $(ARGS)

clean-demo:
	rm -rf sparkpoint-demo

# constraints.txt: the exact set `make` and CI install, resolved afresh from pyproject.toml's
# ranges on Python $(PYTHON_VERSION) (every extra, so `make docs` and `make bench` are pinned too).
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip
	.venv-lock/bin/python -m pip install -q -e ".[spark,test,docs,material,bench]"
	{ echo "# The exact known-good set: make bootstrap, make demo and CI install with -c constraints.txt."; \
	  echo "# Regenerate with 'make lock' (Python $(PYTHON_VERSION)); pyproject.toml holds the ranges."; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable; } > constraints.txt
	rm -rf .venv-lock
