"""What a user installs: the wheel and sdist build and pass `twine check`, carry the
license and none of the project's test servers, and the wheel installs on the oldest
supported Python next to a platform's own PySpark and libraries (the oldest PySpark and
every dependency at its lower bound) without replacing any of them. There it runs a
bounded pipeline through a failover, and the output equals an independent reference.

The platform is installed with uv from its cache in .cache/uv (PySpark alone is ~400 MB
of wheel: pip would unpack it again on every run; uv links it), sparkpoint with the pip
inside the venv, as a user would. A re-run needs no network."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = [pytest.mark.e2e, pytest.mark.packaging]

REPO = Path(__file__).resolve().parents[2]
PIP_CACHE = REPO / ".cache" / "pip"
UV_CACHE = REPO / ".cache" / "uv"
OLDEST_PYTHON = "3.11"
# sparkpoint.testing keeps only what users call: the processor tester. The Kafka
# launcher, S3 server helper, cluster harness and in-memory storage belong to the test tree.
USER_TESTING_MODULES = {"__init__.py", "harness.py", "harness_keys.py"}
TEST_SERVERS = {"kafka_broker.py", "s3_server.py", "spark_cluster.py"}


def _run(cmd: list[str], timeout: float = 600, **kwargs) -> str:
    env = kwargs.pop("env", None) or _clean_env()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _clean_env() -> dict[str, str]:
    # Nothing of the checkout may leak into the installed package's runs.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PIP_CACHE_DIR=str(PIP_CACHE), UV_CACHE_DIR=str(UV_CACHE), PIP_DISABLE_PIP_VERSION_CHECK="1",
               PYTHONUNBUFFERED="1")
    return env


def _oldest_python() -> str:
    candidates = [os.environ.get("SPARKPOINT_OLDEST_PYTHON", ""), f"python{OLDEST_PYTHON}",
                  *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{OLDEST_PYTHON}.*/bin/python{OLDEST_PYTHON}")))]
    for candidate in filter(None, candidates):
        found = shutil.which(candidate)
        if not found:
            continue
        probe = subprocess.run([found, "-c", "import sys; print('%d.%d' % sys.version_info[:2], sys.executable)"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.split()[0] == OLDEST_PYTHON:
            return probe.stdout.split()[1]
    pytest.fail(f"Python {OLDEST_PYTHON}, the oldest supported, is needed to test the wheel on it: install it, "
                f"or set SPARKPOINT_OLDEST_PYTHON=/path/to/python{OLDEST_PYTHON}")


def _lower_bounds() -> dict[str, str]:
    """Every runtime dependency, PySpark and deltalake at the lowest version pyproject.toml allows."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    bounds = {}
    for line in [*project["dependencies"], *extras["spark"], *extras["delta"]]:
        req = Requirement(line)
        floors = [s.version for s in req.specifier if s.operator == ">="]
        assert floors, f"{line}: every dependency needs a tested lower bound (>=)"
        bounds[req.name] = floors[0]
    return bounds


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # The sdist first, then the wheel built from it: a file missing from the sdist fails here.
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], cwd=out)
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("sparkpoint-*.whl")
    return wheel


def test_wheel_and_sdist_pass_twine_check(dist):
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    out = _run([sys.executable, "-m", "twine", "check", "--strict", *files])
    assert out.count("PASSED") == 2, out


def test_the_wheel_holds_the_license_and_no_test_servers(dist):
    with zipfile.ZipFile(_wheel(dist)) as wheel:
        names = wheel.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = wheel.read(metadata).decode()
    testing = {Path(n).name for n in names if n.startswith("sparkpoint/testing/")}
    assert testing <= USER_TESTING_MODULES, f"test-only modules in the wheel: {sorted(testing - USER_TESTING_MODULES)}"
    assert "harness.py" in testing
    assert not [n for n in names if n.startswith("tests/")]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: Apache-2.0" in meta
    # PySpark only through the extras (itself, or its Spark Connect client): a cluster's own
    # is used as it is.
    assert sorted(line for line in meta.splitlines() if line.startswith("Requires-Dist: pyspark")) == \
        ['Requires-Dist: pyspark<5,>=4.0; extra == "spark"',
         'Requires-Dist: pyspark[connect]<5,>=4.0; extra == "connect"']
    assert not [line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "==" in line.split(";")[0]], \
        "a pinned runtime dependency would replace a platform's own"


def test_the_sdist_holds_no_test_servers(dist):
    (sdist,) = dist.glob("sparkpoint-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {Path(m.name).name for m in tar.getmembers() if "/sparkpoint/testing/" in m.name}
    assert not names & TEST_SERVERS, sorted(names & TEST_SERVERS)


PIPELINE = """
from sparkpoint import DeltaSink, FileSource, Pipeline, TumblingWindow

pipeline = (
    Pipeline("wheel")
    .source(FileSource(r"{input}", format="json", schema="key STRING, ts TIMESTAMP, value BIGINT",
                       bounded=True, max_files_per_epoch=1))
    .watermark("ts", delay="1 s")
    .stateful(TumblingWindow("counts", ["key"], "ts", size="10 s", aggs=("count", "sum"), value_column="value",
                             value_type="bigint"))
    .sink(DeltaSink(r"{output}"))
)
"""

READ_OUTPUT = """
import datetime as dt, json, os, sys
import sparkpoint
from deltalake import DeltaTable

def utc(ts):
    return ts.astimezone(dt.timezone.utc).replace(tzinfo=None) if ts.tzinfo else ts

rows = DeltaTable(sys.argv[1]).to_pyarrow_table().to_pylist()
print(json.dumps({"sparkpoint": sparkpoint.__file__,
                  "rows": [[r["key"], utc(r["window_start"]).isoformat(), r["count"], r["sum"]] for r in rows]}))
sys.stdout.flush()
os._exit(0)  # with rocksdict and deltalake both loaded, teardown sometimes aborts (C++ terminate)
"""


def _write_input(root: Path, files: int = 8, per_file: int = 400) -> dict[tuple[str, str], tuple[int, int]]:
    """JSON-lines files in event-time order (each file's events are 5 s later than the
    last file's), and the reference: per key and 10-second window, count and sum."""
    import datetime as dt

    root.mkdir()
    start = dt.datetime(2024, 1, 1)
    counts: Counter = Counter()
    sums: Counter = Counter()
    for f in range(files):
        lines = []
        for i in range(per_file):
            key = f"k{(f * per_file + i) % 13}"
            ts = start + dt.timedelta(milliseconds=f * 5_000 + i * 5_000 // per_file)
            value = (f * 31 + i * 7) % 101
            lines.append(json.dumps({"key": key, "ts": ts.isoformat(), "value": value}))
            window = (ts - dt.timedelta(seconds=ts.second % 10, microseconds=ts.microsecond)).isoformat()
            counts[key, window] += 1
            sums[key, window] += value
        (root / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    return {k: (counts[k], sums[k]) for k in counts}


def test_the_wheel_runs_next_to_the_platforms_pyspark_without_replacing_it(dist, tmp_path):
    venv = tmp_path / "venv"
    uv = [sys.executable, "-m", "uv"]
    _run([*uv, "venv", "-q", "--seed", "--python", _oldest_python(), str(venv)])
    py = str(venv / "bin" / "python")

    # The platform: its own (here the oldest supported) PySpark and libraries.
    bounds = _lower_bounds()
    _run([*uv, "pip", "install", "-q", "--python", py, *(f"{name}=={version}" for name, version in bounds.items())])
    before = _run([py, "-m", "pip", "list", "--format=freeze"]).split()

    _run([py, "-m", "pip", "install", "-q", str(_wheel(dist))])
    after = _run([py, "-m", "pip", "list", "--format=freeze"]).split()
    assert sorted(set(after) - set(before)) == ["sparkpoint==0.1.0"], "installing sparkpoint changed the platform"
    assert set(before) <= set(after)
    (pyspark,) = [line.split("==")[1] for line in after if line.lower().startswith("pyspark==")]
    assert Version(pyspark) == Version(bounds["pyspark"])

    job = tmp_path / "job"
    job.mkdir()
    expected = _write_input(job / "input")
    (job / "pipeline.py").write_text(PIPELINE.format(input=job / "input", output=job / "output"))
    env = dict(_clean_env(), PYSPARK_PYTHON=py, PYSPARK_DRIVER_PYTHON=py)
    run = subprocess.run(
        [str(venv / "bin" / "sparkpoint"), "--log-level", "INFO", "run", "pipeline.py",
         "--set", f"execution.checkpointing.dir={job / 'checkpoints'}", "--set", f"state.local.dir={job / 'state'}",
         "--set", "execution.checkpointing.interval=1 s", "--set", "execution.checkpointing.timeout=10 min",
         "--set", "rest.port=0", "--set", "parallelism.default=2",
         # Checkpoint 3 fails and no failure is tolerated: the job fails over, restores the
         # last completed checkpoint and reruns the epochs after it, whose output was
         # written but not yet committed. Exactly-once: none of it lost, none twice.
         "--set", "execution.checkpointing.tolerable-failed-checkpoints=0",
         "--set", 'sparkpoint.faults=[{participant: "state:*", action: async_error, checkpoints: [3]}]'],
        cwd=job, env=env, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert "RESTARTING" in log and "FINISHED" in log, log[-4000:]

    read = json.loads(_run([py, "-c", READ_OUTPUT, str(job / "output")], env=env, cwd=job))
    assert read["sparkpoint"].startswith(str(venv)), "the run must use the installed wheel, not the checkout"
    got = Counter((key, window) for key, window, _, _ in read["rows"])
    assert [k for k, n in got.items() if n > 1] == [], "a window was committed twice"
    assert {(key, window): (count, total) for key, window, count, total in read["rows"]} == expected
