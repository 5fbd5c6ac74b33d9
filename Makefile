# Two entry points, both bootstrap everything on a fresh machine (Python 3.11 + Java 17):
#   make demo   run the demo pipeline on embedded local Spark
#   make test   run the test suite
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON311 ?= $(shell command -v python3.11 || command -v python3)

.PHONY: demo test test-fast bootstrap check-java kafka-jars bench clean-demo docs chaos

check-java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17 is required (Spark runs on the JVM). Install a JDK 17, e.g. 'apt-get install openjdk-17-jdk-headless', or put it on PATH." >&2; exit 1; }
	@java -version 2>&1 | head -1 | grep -Eq '"(1[7-9]|2[0-9])' || { echo "error: Java 17+ is required, found: $$(java -version 2>&1 | head -1)" >&2; exit 1; }

$(VENV)/.installed: pyproject.toml
	@$(PYTHON311) -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || { echo "error: Python 3.11 is required (found $$($(PYTHON311) --version 2>&1))" >&2; exit 1; }
	$(PYTHON311) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $@

bootstrap: check-java $(VENV)/.installed

kafka-jars: bootstrap
	@command -v mvn >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && apt-get install -y -qq maven >/dev/null; else echo "error: mvn (Apache Maven) is needed once to fetch the Kafka broker jars from Maven Central; install it (apt-get install maven)" >&2; exit 1; fi; }
	bash scripts/fetch_kafka.sh

# The browser tests (dashboard, cross-site requests) drive /usr/bin/chromium; no test installs it.
.PHONY: chromium
chromium:
	@test -x /usr/bin/chromium || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; else echo "error: the browser tests need Chromium at /usr/bin/chromium; install it (apt-get install chromium)" >&2; exit 1; fi; }

demo: bootstrap
	$(VENV)/bin/sparkpoint run examples/demo.py --config examples/demo.yaml

test: bootstrap kafka-jars chromium
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

# The tier that starts no job or server process of its own: unit tests and the
# in-process integration tests on one shared Spark session (the Kafka tests need a
# broker JVM and stay in `make test`).
test-fast: bootstrap
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests/unit tests/integration --ignore=tests/integration/kafka

# `sparkpoint chaos --storm` over 20 seeds (SEEDS=N to change) on a Delta sink with checkpoints
# on an S3 API and on Kafka source and sink: every fault kind once per seed. The reports (runs,
# faults, rows lost and duplicated; expected 0) are printed at the end and kept in CHAOS_OUT.
SEEDS ?= 20
CHAOS_OUT ?= chaos-out
chaos: bootstrap kafka-jars
	rm -rf $(CHAOS_OUT) && mkdir -p $(CHAOS_OUT)
	SPARKPOINT_CHAOS_SEEDS=$(SEEDS) SPARKPOINT_CHAOS_OUT=$(abspath $(CHAOS_OUT)) SPARKPOINT_CHAOS_FULL=1 \
		$(PY) -m pytest -q -p no:cacheprovider tests/e2e/test_chaos_storm.py tests/e2e/test_chaos_kafka_fallback.py; rc=$$?; \
		cat $(CHAOS_OUT)/*/chaos-report.md > $(CHAOS_OUT)/chaos-report.md 2>/dev/null; \
		cat $(CHAOS_OUT)/chaos-report.md; exit $$rc

# The docs site with the API reference from the docstrings, into site/.
docs: bootstrap
	$(PY) -m pip install -q -e ".[docs]"
	$(PY) scripts/gen_config_keys.py
	$(VENV)/bin/mkdocs build --strict

# Every benchmark (W1 at 100k and 1M keys, W2, W3, latency; PyFlink peer via
# bench/pyflink/setup.sh), then bench/RESULTS.md and bench/plots/*.png. ARGS passes options, e.g.
# make bench ARGS="--only w1,w2 --runs 3" or ARGS="--more --runs 0" (re-render only).
bench: bootstrap
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) bench/run_all.py $(ARGS)

clean-demo:
	rm -rf sparkpoint-demo
