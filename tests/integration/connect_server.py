"""The Spark Connect server that ships with pyspark (`sbin/start-connect-server.sh`, the
connect jar in `pyspark/jars`), started in the foreground on 127.0.0.1 and a free port,
local[2], and stopped (its whole process group) when the block ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
CLIENT_MODULES = ("grpc", "grpc_status", "google.rpc", "zstandard")


def missing_client_modules() -> list[str]:
    """The Spark Connect client's modules (pyspark[connect]) this Python cannot import."""
    import importlib.util

    missing = []
    for name in CLIENT_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def connect_server(workdir: Path, startup_timeout_s: float = 180) -> Iterator[str]:
    """Yields the server's URL, sc://127.0.0.1:PORT. Its Python workers run this
    interpreter with this checkout on PYTHONPATH (they run the job's steps)."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    workdir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        # spark-daemon.sh writes its log and pid file here, not into the installed pyspark.
        "SPARK_LOG_DIR": str(workdir / "logs"),
        "SPARK_PID_DIR": str(workdir),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    cmd = ["bash", str(spark_home / "sbin" / "start-connect-server.sh"), "--wait", "--master", "local[2]",
           "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
           "--conf", "spark.driver.memory=1g", "--conf", "spark.ui.enabled=false",
           "--conf", f"spark.local.dir={workdir / 'spark-local'}"]
    log_path = workdir / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not _accepting(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the Spark Connect server did not start (exit {proc.poll()}):\n{tail}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the script, the JVM, its Python workers),
    then SIGKILL to whatever of the group is left."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
