"""Run a pipeline from Python: `sparkpoint.run(pipeline)`, or `pipeline.run()`, which
delegates here.

The one module allowed to know both the builder (api/) and the runtime. The runtime is
imported when a job starts, not when `sparkpoint` is imported: executors import sparkpoint
too and have no use for the driver's JobMaster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkpoint.api.pipeline import Pipeline
    from sparkpoint.runtime.jobmaster import JobResult


def run(pipeline: Pipeline, config: str | None = None, sets: list[str] | None = None, *, spark: Any = None,
        **overrides: Any) -> JobResult:
    """Run `pipeline` until its source is exhausted or the job is cancelled. `config` is a
    YAML file of configuration keys, `sets` are "key=value" strings; keyword overrides use
    python names, or Flink keys via a dict: run(p, overrides={"parallelism.default": 4}).

    `spark` is the session to run in; without it, the session active on this thread (a
    notebook's, a spark-submit script's), else one sparkpoint creates. A session the job
    is given keeps its settings (spark.master and spark.conf do not apply to it) and is
    never stopped by the job."""
    from sparkpoint.config import Settings
    from sparkpoint.runtime.jobmaster import JobMaster
    from sparkpoint.runtime.spark import active_session

    extra = overrides.pop("overrides", {})
    settings = Settings.load(config, sets, overrides={**overrides, **extra},
                             base={"pipeline.name": pipeline.name} if pipeline.name else None)
    return JobMaster(pipeline, settings, spark=spark if spark is not None else active_session()).run()
