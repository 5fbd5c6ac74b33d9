"""A real single-node Apache Kafka broker (KRaft, combined broker + controller) for
tests, benchmarks and local runs from a checkout of the repository.

It runs the official Apache Kafka jars that `scripts/fetch_kafka.sh` puts in
`<repo>/.cache/kafka/libs` (from Maven Central). Nothing is mocked: transactions,
consumer groups and read_committed isolation behave as on a production cluster.

    with KafkaBroker(tmp_dir) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        broker.restart()   # same data, same ports

The broker listens on 127.0.0.1 only, on ports picked free at first start and kept
across restarts so clients reconnect on their own.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType

from tests.servers.lifetime import die_with_parent, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LIBS = REPO_ROOT / ".cache" / "kafka" / "libs"
FETCH_SCRIPT = REPO_ROOT / "scripts" / "fetch_kafka.sh"

_READY_TIMEOUT_S = 90.0
_STOP_TIMEOUT_S = 20.0

_LOG4J2 = """\
Configuration:
  status: warn
  Appenders:
    File:
      name: file
      fileName: "{log}"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: warn
      AppenderRef:
        ref: file
    Logger:
      - name: kafka.server.KafkaServer
        level: info
      - name: kafka.server.BrokerServer
        level: info
"""


class KafkaBrokerError(RuntimeError):
    """The local test broker could not be set up or started. The message names the
    step; the broker's own log (path in the message) says why."""


def ensure_kafka_jars(libs_dir: Path = DEFAULT_LIBS, *, spark_connector: bool = False) -> Path:
    """Download the broker jars once (idempotent); return their directory. With
    `spark_connector`, also Spark's Kafka connector into `<libs_dir>/../spark-connector`."""
    wanted = [libs_dir] + ([libs_dir.parent / "spark-connector"] if spark_connector else [])
    if all((d / ".complete").exists() for d in wanted):
        return libs_dir
    if shutil.which("mvn") is None:
        raise KafkaBrokerError(
            f"Kafka jars are missing in {libs_dir} and `mvn` is not installed: "
            "install Maven (apt-get install maven) or run scripts/fetch_kafka.sh elsewhere "
            f"and copy the jars into {libs_dir}")
    env = dict(os.environ, SPARKPOINT_KAFKA_CACHE=str(libs_dir.parent))
    args = ["bash", str(FETCH_SCRIPT)] + (["--spark-connector"] if spark_connector else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not all((d / ".complete").exists() for d in wanted):
        raise KafkaBrokerError(f"fetching the Kafka jars failed ({FETCH_SCRIPT}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return libs_dir


def _random_cluster_id(draw=uuid.uuid4) -> str:
    # The format `kafka-storage random-uuid` prints: url-safe base64 of 16 bytes, unpadded.
    # One in 64 starts with "-", which kafka-storage's argument parser takes for an option
    # ("--cluster-id: expected one argument"): draw again (Kafka's own tool does the same).
    while True:
        cluster_id = base64.urlsafe_b64encode(draw().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    """One local KRaft broker whose data lives under `workdir`."""

    def __init__(self, workdir: str | os.PathLike[str], *, libs_dir: Path = DEFAULT_LIBS,
                 heap: str = "512m", extra_config: dict[str, str] | None = None):
        self.workdir = Path(workdir)
        self.libs_dir = Path(libs_dir)
        self.heap = heap
        self.extra_config = dict(extra_config or {})
        self._broker_port: int | None = None
        self._controller_port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    # -- public API ------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        if self._broker_port is None:
            raise KafkaBrokerError("the broker has not been started: call start() first")
        return f"127.0.0.1:{self._broker_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    def start(self) -> "KafkaBroker":
        """Start the broker (formatting its storage on first start) and wait until it
        answers a metadata request. Idempotent while running."""
        if self.running:
            return self
        ensure_kafka_jars(self.libs_dir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._broker_port is None:
            self._broker_port, self._controller_port = free_port(), free_port()
        config = self._write_config()
        if not (self.workdir / "data" / "meta.properties").exists():
            self._format_storage(config)
        with open(self.workdir / "broker.out", "ab") as out:
            self._process = subprocess.Popen(
                self._java("kafka.Kafka", str(config)), stdout=out, stderr=subprocess.STDOUT,
                cwd=self.workdir, start_new_session=True, preexec_fn=die_with_parent())
        atexit.register(self.stop)
        self._wait_ready()
        return self

    def stop(self) -> None:
        """Stop the broker gracefully (SIGTERM, then SIGKILL after a timeout). Data and
        ports are kept for a later start()."""
        proc, self._process = self._process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> "KafkaBroker":
        self.stop()
        return self.start()

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------
    def _java(self, main_class: str, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise KafkaBrokerError("`java` is not on PATH: install a JDK 17+ "
                                   "(apt-get install openjdk-17-jre-headless)")
        log4j = self.workdir / "log4j2.yaml"
        log4j.write_text(_LOG4J2.format(log=self.log_path))
        return [java, f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",  # faster start; the broker is not the bottleneck in tests
                "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={log4j}",
                "-cp", f"{self.libs_dir}/*", main_class, *args]

    def _write_config(self) -> Path:
        bp, cp = self._broker_port, self._controller_port
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{cp}",
            "listeners": f"PLAINTEXT://127.0.0.1:{bp},CONTROLLER://127.0.0.1:{cp}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{bp}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            # One node: internal topics cannot be replicated, and few partitions start fast.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Keep everything: tests write records with old timestamps on purpose.
            "log.retention.ms": "-1",
            **self.extra_config,
        }
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def _format_storage(self, config: Path) -> None:
        done = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "--ignore-formatted",
                       "--cluster-id", _random_cluster_id(), "--config", str(config)),
            capture_output=True, text=True, cwd=self.workdir)
        if done.returncode != 0:
            raise KafkaBrokerError(f"formatting the broker storage in {self.workdir} failed:\n"
                                   f"{done.stdout[-2000:]}{done.stderr[-2000:]}")

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0,
                             "socket.connection.setup.timeout.ms": 1000,
                             "reconnect.backoff.max.ms": 200})
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise KafkaBrokerError(
                    f"the Kafka broker exited during start-up; see {self.workdir / 'broker.out'} "
                    f"and {self.log_path}")
            try:
                metadata = admin.list_topics(timeout=1.0)
                if metadata.brokers:
                    return
            except Exception:  # not listening yet: keep polling until the deadline
                pass
            time.sleep(0.2)
        self.stop()
        raise KafkaBrokerError(f"the Kafka broker did not answer within {_READY_TIMEOUT_S:.0f}s; "
                               f"see {self.log_path}")


def main() -> None:  # pragma: no cover - manual use: python -m tests.servers.kafka_broker DIR
    workdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/sparkpoint-kafka"
    with KafkaBroker(workdir) as broker:
        print(f"Kafka broker ready at {broker.bootstrap_servers} (Ctrl-C stops it)", flush=True)
        try:
            while broker.running:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":  # pragma: no cover
    main()
