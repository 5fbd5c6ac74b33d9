"""`sparkpoint` command line.

    sparkpoint run PIPELINE.py [--config FILE] [--set key=value ...]
    sparkpoint checkpoints list DIR [--job NAME] [--json]
    sparkpoint checkpoints verify DIR [--job NAME] [--json]
    sparkpoint doctor DIR [--job NAME] [--json]
    sparkpoint config-keys
    sparkpoint chaos PIPELINE.py [--faults kill9,outage,corrupt,second] [--seed N]   (chaos.py)
    sparkpoint nexmark generate --events N --out DIR [--seed S] [--rate R]   (nexmark_cli.py)
    sparkpoint status|checkpoint|savepoint|stop --checkpoint-dir DIR --job NAME   (control_cli.py)
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

import click

from sparkpoint.errors import SparkpointError


def _load_pipeline(path: str):
    from sparkpoint.api.pipeline import Pipeline

    file = Path(path)
    if not file.exists():
        raise click.ClickException(f"pipeline file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"sparkpoint_user_pipeline_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.parent.resolve()))
    spec.loader.exec_module(module)
    candidate = getattr(module, "pipeline", None)
    if candidate is None and callable(getattr(module, "build_pipeline", None)):
        candidate = module.build_pipeline()
    if not isinstance(candidate, Pipeline):
        raise click.ClickException(f"{path} must define `pipeline = Pipeline(...)` or `def build_pipeline()`")
    return candidate


@click.group()
@click.option("--log-level", default=os.environ.get("SPARKPOINT_LOG_LEVEL", "WARNING"), show_default=True)
def cli(log_level: str) -> None:
    """Exactly-once stateful stream processing for PySpark."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


@cli.command()
@click.argument("pipeline_file")
@click.option("--config", "config_file", type=click.Path(), help="YAML file of configuration keys")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override one configuration key")
@click.option("--from-savepoint", "savepoint", metavar="PATH",
              help="start from this savepoint (or chk-<id> directory): execution.state-recovery.path")
@click.option("--claim-mode", type=click.Choice(["NO_CLAIM"]), default=None,
              help="execution.state-recovery.claim-mode (NO_CLAIM: the savepoint is never modified or deleted)")
@click.option("--allow-non-restored-state", "allow_non_restored", is_flag=True, default=False,
              help="drop the state of steps the pipeline no longer has: execution.savepoint.ignore-unclaimed-state")
def run(pipeline_file: str, config_file: str | None, sets: tuple[str, ...], savepoint: str | None,
        claim_mode: str | None, allow_non_restored: bool) -> None:
    """Run a pipeline until its input ends or it is stopped (Ctrl-C / SIGTERM)."""
    from sparkpoint.config import Settings
    from sparkpoint.runtime.jobmaster import JobMaster
    from sparkpoint.runtime.spark import active_session
    from sparkpoint.runtime.status import JobStatus

    try:
        pipeline = _load_pipeline(pipeline_file)
        if savepoint:
            sets += (f"execution.state-recovery.path={savepoint}",)
        if claim_mode:
            sets += (f"execution.state-recovery.claim-mode={claim_mode}",)
        if allow_non_restored:
            sets += ("execution.savepoint.ignore-unclaimed-state=true",)
        settings = Settings.load(config_file, list(sets),
                                 base={"pipeline.name": pipeline.name} if pipeline.name else None)
        click.echo(f"sparkpoint: job {settings.job_name}: checkpoints in "
                   f"{os.path.abspath(settings.checkpoint_dir) if '://' not in settings.checkpoint_dir else settings.checkpoint_dir}"
                   f", every {settings.checkpoint_interval_ms} ms")
        # A session the pipeline file made itself is the job's, with its settings, as in sparkpoint.run.
        result = JobMaster(pipeline, settings, spark=active_session()).run()
    except SparkpointError as e:
        click.echo(f"sparkpoint: error: {e}", err=True)
        sys.exit(2)
    click.echo("")
    click.echo(f"job {settings.job_name} {result.status.value}: {result.epochs} epochs, "
               f"{result.records:,} records read in this run, {result.completed_checkpoints} checkpoints completed, "
               f"{result.failed_checkpoints} failed, {result.restarts} restarts")
    if result.output:
        click.echo(f"  exactly-once output : {result.output}   ({result.extra.get('read_hint')})")
    click.echo(f"  checkpoints         : {result.checkpoint_dir}   (last completed: "
               f"{result.last_checkpoint_id})")
    click.echo(f"  inspect             : sparkpoint checkpoints list {settings.checkpoint_dir}")
    if result.extra.get("savepoint"):
        click.echo(f"  stopped with        : savepoint {result.extra['savepoint']}   (resume: sparkpoint run "
                   f"{pipeline_file} --from-savepoint {result.extra['savepoint']})")
    state = result.extra.get("state")
    if state:
        click.echo(f"  state               : {state['tasks']} subtask-epochs, {state['moves']} moves between executors, "
                   f"{state['rebuilds']} rebuilds (p50 {state['rebuild_ms_p50']} ms, max {state['rebuild_ms_max']} ms), "
                   f"{state['catch_ups']} catch-ups, {state['snapshots']} snapshots uploaded")
        click.echo(f"  state (json)        : {json.dumps(state, sort_keys=True)}")
    if result.extra.get("cancelled_after"):
        click.echo(f"sparkpoint: error: job {settings.job_name} was cancelled while restarting after a failure "
                   f"({result.extra['cancelled_after']}); the next run resumes from "
                   + (f"checkpoint {result.last_checkpoint_id}" if result.last_checkpoint_id is not None
                      else "scratch (no checkpoint completed)"), err=True)
    sys.exit(exit_code(result))


def exit_code(result) -> int:
    """0 for a job that ended as asked: its input ended, or it was stopped or cancelled
    while it ran. 1 for anything else, including a cancel that cut a restart short: the
    job was failing, not stopping."""
    from sparkpoint.runtime.status import JobStatus

    if result.status is JobStatus.FINISHED:
        return 0
    if result.status is JobStatus.CANCELED and not result.extra.get("cancelled_after"):
        return 0
    return 1


@cli.command("config-keys")
def config_keys() -> None:
    """List every configuration key with its default."""
    from sparkpoint.config import Settings

    for name, f in sorted(Settings.model_fields.items(), key=lambda kv: kv[1].alias or kv[0]):
        default = f.default if f.default_factory is None else f.default_factory()
        click.echo(f"{f.alias:60s} {default!r}")


@cli.group()
def checkpoints() -> None:
    """Inspect checkpoint directories."""


def _options(raw: str | None) -> dict | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"--storage-options must be a JSON object ({e})") from None
    if not isinstance(value, dict):
        raise click.BadParameter("--storage-options must be a JSON object, e.g. '{\"key\": \"...\"}'")
    return value


_storage_options = click.option(
    "--storage-options", default=None, metavar="JSON",
    help="fsspec options for DIR, as for execution.checkpointing.storage-options (e.g. an S3 endpoint)")


def _emit(report, as_json: bool) -> None:
    data = report.to_dict() if hasattr(report, "to_dict") else report
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        click.echo(report.render() if hasattr(report, "render") else json.dumps(data, indent=2, default=str))


@checkpoints.command("list")
@click.argument("directory")
@click.option("--job", default=None, help="job name (default: every job under DIR)")
@click.option("--json", "as_json", is_flag=True)
@_storage_options
def list_cmd(directory: str, job: str | None, as_json: bool, storage_options: str | None) -> None:
    """Completed and in-progress checkpoints of the jobs under DIR."""
    from sparkpoint.ops.inspect_cli import list_report

    _emit(list_report(directory, job, _options(storage_options)), as_json)


@checkpoints.command("verify")
@click.argument("directory")
@click.option("--job", default=None)
@click.option("--json", "as_json", is_flag=True)
@_storage_options
def verify_cmd(directory: str, job: str | None, as_json: bool, storage_options: str | None) -> None:
    """Verify metadata checksums and every referenced file's size and checksum."""
    from sparkpoint.ops.inspect_cli import verify_report

    report = verify_report(directory, job, _options(storage_options))
    _emit(report, as_json)
    sys.exit(0 if report.ok else 1)


@cli.command()
@click.argument("directory")
@click.option("--job", default=None)
@click.option("--json", "as_json", is_flag=True)
@_storage_options
def doctor(directory: str, job: str | None, as_json: bool, storage_options: str | None) -> None:
    """Lease holder, checkpoints and validity, orphans, id collisions, corrupt files — and what to do."""
    from sparkpoint.ops.inspect_cli import doctor_report

    report = doctor_report(directory, job, _options(storage_options))
    _emit(report, as_json)
    sys.exit(0 if report.ok else 1)


from sparkpoint.ops.control_cli import register as _register_control  # noqa: E402

_register_control(cli)

from sparkpoint.ops.chaos import register as _register_chaos  # noqa: E402

_register_chaos(cli)

from sparkpoint.ops.nexmark_cli import register as _register_nexmark  # noqa: E402

_register_nexmark(cli)


def main() -> None:
    cli(prog_name="sparkpoint")


if __name__ == "__main__":
    main()
