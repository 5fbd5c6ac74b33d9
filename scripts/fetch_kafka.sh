#!/usr/bin/env bash
# Fetch the Apache Kafka broker jars (and, with --spark-connector, Spark's Kafka
# connector for the reader benchmark) from Maven Central into <repo>/.cache/kafka/.
# Idempotent: a directory that is already complete is skipped.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SPARKPOINT_KAFKA_CACHE:-$repo/.cache/kafka}"
settings="$repo/scripts/kafka-maven-settings.xml"

fetch() {  # fetch <pom> <dir>
  local pom="$1" dir="$2"
  if [[ -f "$dir/.complete" ]]; then
    echo "kafka jars already in $dir"
    return
  fi
  rm -rf "$dir.partial"
  local started=$SECONDS
  mvn -q -B -s "$settings" -f "$pom" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$dir.partial"
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  touch "$dir/.complete"   # written last: a half-finished download is never mistaken for done
  echo "fetched $(ls "$dir" | wc -l) jars into $dir in $((SECONDS - started))s"
}

mkdir -p "$cache"
fetch "$repo/scripts/kafka-pom.xml" "$cache/libs"
if [[ "${1:-}" == "--spark-connector" ]]; then
  fetch "$repo/scripts/spark-kafka-pom.xml" "$cache/spark-connector"
fi
