#!/usr/bin/env bash
# Creates the PyFlink benchmark's own virtualenv at bench/.venv-pyflink (apache-flink pins
# pandas<2.3, pyarrow<21 and py4j 0.10.9.7, which conflict with the project's venv).
#
#     bash bench/pyflink/setup.sh          # idempotent: does nothing when the marker is there
#     PYFLINK_VENV=/path bash bench/pyflink/setup.sh
#
# Needs python3.11 and Java 17 (`java` on PATH or JAVA_HOME). Prints the venv's python on success.
set -euo pipefail

FLINK_VERSION="${FLINK_VERSION:-2.3.0}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${PYFLINK_VENV:-$(dirname "$HERE")/.venv-pyflink}"
PYTHON="${PYTHON:-python3.11}"
MARKER="$VENV/.sparkpoint-pyflink-$FLINK_VERSION"
# The Nexmark peer (nexmark_flink.py) reads Parquet: Flink's format jar and the Hadoop classes it
# needs, from Maven Central, into $PYFLINK_JARS (default $VENV/jars).
JARS="${PYFLINK_JARS:-$VENV/jars}"
HADOOP_VERSION="${HADOOP_VERSION:-3.3.6}"
MAVEN="${MAVEN_REPO:-https://repo1.maven.org/maven2}"
LOG="$(mktemp -t pyflink-setup.XXXXXX.log)"

fail() { echo "bench/pyflink/setup.sh: $*" >&2; [ -s "$LOG" ] && { echo "--- last lines of $LOG:" >&2; tail -n 20 "$LOG" >&2; }; exit 1; }

fetch_jars() {
  mkdir -p "$JARS"
  local spec group artifact version file
  for spec in "org/apache/flink flink-sql-parquet $FLINK_VERSION" \
              "org/apache/hadoop hadoop-client-api $HADOOP_VERSION" \
              "org/apache/hadoop hadoop-client-runtime $HADOOP_VERSION"; do
    read -r group artifact version <<<"$spec"
    file="$JARS/$artifact-$version.jar"
    [ -s "$file" ] && continue
    curl -sfL --retry 3 -o "$file.part" "$MAVEN/$group/$artifact/$version/$artifact-$version.jar" >>"$LOG" 2>&1 \
      || fail "could not download $artifact-$version.jar from $MAVEN"
    mv "$file.part" "$file"
  done
}

if [ -f "$MARKER" ]; then
  fetch_jars
  rm -f "$LOG"
  echo "$VENV/bin/python"
  exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || fail "$PYTHON not found (set PYTHON=... to a Python 3.11 interpreter)"
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  fail "java not found: PyFlink needs Java 17 (install it or set JAVA_HOME)"
fi

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 || fail "could not create the virtualenv $VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >>"$LOG" 2>&1 \
  || fail "pip upgrade failed"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "apache-flink==$FLINK_VERSION" >>"$LOG" 2>&1 \
  || fail "pip install apache-flink==$FLINK_VERSION failed"
"$VENV/bin/python" -c "import pyflink, os; assert os.path.isdir(os.path.join(os.path.dirname(pyflink.__file__), 'lib'))" \
  >>"$LOG" 2>&1 || fail "pyflink installed but its jars (pyflink/lib) are missing"
fetch_jars
touch "$MARKER"
rm -f "$LOG"
echo "$VENV/bin/python"
