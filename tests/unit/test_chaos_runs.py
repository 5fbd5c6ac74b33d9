"""`sparkpoint chaos`: the verdict of a run that did not finish says why, in the run's own
words (the report is often all that is left of a CI run), and what a run is told."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from sparkpoint.ops.chaos import Chaos, Output, Run, Verdict


def _run(tmp_path: Path, script: str) -> Run:
    run = Run([sys.executable, "-c", script], tmp_path, {}, tmp_path / "run.log")
    run.wait(60)
    return run


def _judged(tmp_path: Path, run: Run, rc: int) -> Verdict:
    chaos = Chaos(str(tmp_path / "pipeline.py"), None, (), ["kill9"], 1, tmp_path, timeout=60, kills=None)
    chaos.expected = Counter({("a",): 1})
    chaos.output = Output("parquet", "out")  # nothing committed there
    verdict = Verdict("kill9", 1, passed=True)
    chaos.judge(verdict, tmp_path, run, rc, [run])
    return verdict


def test_a_run_that_stopped_with_an_error_is_judged_with_its_error_line(tmp_path: Path) -> None:
    run = _run(tmp_path, "import sys\n"
                         "print('2026-01-01 00:00:00,000 WARNING x: job j failing over: StorageError: read failed')\n"
                         "print('sparkpoint: error: job j has 2 completed checkpoint(s) but none restores')\n"
                         "sys.exit(2)")
    verdict = _judged(tmp_path, run, 2)
    assert not verdict.passed
    assert verdict.notes[0].startswith("the last run ended with exit code 2, not FINISHED "
                                       "(job j has 2 completed checkpoint(s) but none restores); see ")
    assert verdict.notes[1] == "committed 0 rows, the fault-free run 1"


def test_a_run_that_died_of_an_uncaught_exception_is_judged_with_its_exception_line(tmp_path: Path) -> None:
    run = _run(tmp_path, "raise RuntimeError('the driver lost its JVM')")
    assert "(RuntimeError: the driver lost its JVM)" in _judged(tmp_path, run, 1).notes[0]


def test_a_run_that_only_failed_over_is_judged_with_its_last_failover(tmp_path: Path) -> None:
    run = _run(tmp_path, "print('... job j failing over: IOException: Broken pipe (full trace: t.txt)')\n"
                         "print('... job j failing over: StorageError: read failed (full trace: u.txt)')")
    assert "(StorageError: read failed (full trace: u.txt))" in _judged(tmp_path, run, 0).notes[0]


def test_only_a_run_chaos_leaves_alone_is_told_it_may_run_unpaced(tmp_path: Path, monkeypatch) -> None:
    """A storm's last segment gets SPARKPOINT_CHAOS_FAULTS_DONE=1 (its pipeline may drop
    the pacing that keeps it from outrunning the faults); no other run gets it, even when
    the chaos command itself runs with it set."""
    import sparkpoint.ops.chaos as chaos_module

    started: list[dict[str, str]] = []
    monkeypatch.setattr(chaos_module, "Run", lambda cmd, cwd, env, log: started.append(env) or object())
    monkeypatch.setenv(chaos_module.FAULTS_DONE_ENV, "1")
    chaos = Chaos(str(tmp_path / "pipeline.py"), None, (), ["kill9"], 1, tmp_path, timeout=60, kills=None)
    chaos.output = Output("parquet", "out")
    rundir = tmp_path / "storm"
    chaos.launch(rundir, "segment-0")
    chaos.launch(rundir, "segment-1", faults_done=True)
    assert [env.get(chaos_module.FAULTS_DONE_ENV) for env in started] == [None, "1"]


def test_runs_keep_the_sources_epoch_boundaries_unless_the_config_sizes_epochs(tmp_path: Path) -> None:
    """An update-mode step commits a row per key per epoch: if the sizer cut a slow
    run's epochs and not the fault-free run's, their rows would differ with nothing lost.
    A config that sizes epochs itself keeps its setting."""
    from sparkpoint.config import Settings

    def command(sets: tuple[str, ...]) -> list[str]:
        chaos = Chaos(str(tmp_path / "pipeline.py"), None, sets, ["kill9"], 1, tmp_path, timeout=60, kills=None)
        chaos.settings = Settings.load(None, list(sets))
        return chaos.command(tmp_path / "run", [])

    assert "sparkpoint.epoch.max-duration=0" in command(())
    for own in ("sparkpoint.epoch.max-duration=20 s", "sparkpoint.epoch.target-duration=500 ms"):
        cmd = command((own,))
        assert "sparkpoint.epoch.max-duration=0" not in cmd and own in cmd
