"""The REST API's routes: JSON views of the running job, and the operations that steer it."""

from __future__ import annotations

from concurrent.futures import Future
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

from sparkpoint.errors import ConfigError
from sparkpoint.redaction import mask_url, masked
from sparkpoint.runtime.rest.server import ApiError, RestServer, metrics_page, static_file

JSON = "application/json"


def handle(server: RestServer, method: str, path: str, query: dict[str, list[str]],
           body: dict[str, Any]) -> tuple[HTTPStatus, Any, str]:
    parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
    if method in ("GET", "HEAD"):
        return _get(server, parts, query)
    if method == "POST":
        return _post(server, parts, body)
    raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not supported; use GET or POST")


def _get(server: RestServer, parts: list[str], query: dict[str, list[str]]) -> tuple[HTTPStatus, Any, str]:
    ok = HTTPStatus.OK
    if not parts:
        data, ctype = static_file("index.html")
        return ok, data, ctype
    if parts[0] == "static" and len(parts) == 2:
        data, ctype = static_file(parts[1])
        return ok, data, ctype
    if parts == ["metrics"]:
        data, ctype = metrics_page(server)
        return ok, data, ctype
    if parts == ["config"]:  # Flink's dashboard configuration
        return ok, {"refresh-interval": 1000, "flink-version": None, "features": {"web-submit": False}}, JSON
    if parts == ["jobs"]:
        o = server.observer.overview()
        return ok, {"jobs": [{"id": o["jid"], "status": o["state"]}]}, JSON
    if parts == ["jobs", "overview"]:
        return ok, {"jobs": [server.observer.overview()]}, JSON
    if parts[0] != "jobs" or len(parts) < 2:
        raise ApiError(HTTPStatus.NOT_FOUND, f"no such resource: /{'/'.join(parts)}")
    _check_job(server, parts[1])
    rest = parts[2:]
    job = server.job
    if not rest:
        return ok, server.observer.overview(), JSON
    if rest == ["checkpoints"]:
        return ok, checkpoints_view(server), JSON
    if rest == ["checkpoints", "config"]:
        s = job.settings
        return ok, {"mode": "exactly_once", "interval": s.checkpoint_interval_ms, "timeout": s.checkpoint_timeout_ms,
                    "min_pause": s.checkpoint_min_pause_ms, "max_concurrent": s.checkpoint_max_concurrent,
                    "tolerable_failed_checkpoints": s.tolerable_failed_checkpoints,
                    "num_retained": s.num_retained, "enabled": s.checkpointing_enabled,
                    "checkpoint_storage": masked("execution.checkpointing.dir", s.checkpoint_dir)}, JSON
    if len(rest) == 3 and rest[:2] == ["checkpoints", "details"]:
        return ok, checkpoint_details(server, _int_id(rest[2])), JSON
    if len(rest) == 2 and rest[0] == "checkpoints":
        return ok, server.operation(rest[1], ("checkpoint",)), JSON
    if len(rest) == 2 and rest[0] == "savepoints":
        return ok, server.operation(rest[1], ("savepoint", "stop")), JSON
    if rest == ["config"]:
        return ok, config_view(job), JSON
    if rest == ["exceptions"]:
        return ok, server.observer.exceptions(), JSON
    raise ApiError(HTTPStatus.NOT_FOUND, f"no such resource: /{'/'.join(parts)}")


def _post(server: RestServer, parts: list[str], body: dict[str, Any]) -> tuple[HTTPStatus, Any, str]:
    if len(parts) != 3 or parts[0] != "jobs":
        raise ApiError(HTTPStatus.NOT_FOUND, f"no POST on /{'/'.join(parts)}")
    _check_job(server, parts[1])
    job, action = server.job, parts[2]
    if job.status.status.terminal:
        raise ApiError(HTTPStatus.CONFLICT, f"job {job.job_name} is {job.status.status.value}")
    accepted = HTTPStatus.ACCEPTED
    if action == "checkpoints":
        _only(body, set())
        return accepted, {"request-id": server.start_operation("checkpoint", job.trigger_checkpoint())}, JSON
    if action == "savepoints":
        _only(body, {"target-directory", "cancel-job"})
        target = _optional_str(body, "target-directory")
        if body.get("cancel-job"):
            fut = _call(job, "stop_with_savepoint", target, savepoint=True)
            return accepted, {"request-id": server.start_operation("stop", fut)}, JSON
        fut = _call(job, "trigger_savepoint", target)
        return accepted, {"request-id": server.start_operation("savepoint", fut)}, JSON
    if action == "stop":
        _only(body, {"target-directory", "savepoint", "drain"})
        target = _optional_str(body, "target-directory")
        with_savepoint = bool(body.get("savepoint", target is not None))
        if with_savepoint:
            fut = _call(job, "stop_with_savepoint", target, savepoint=True)
        elif getattr(job, "stop_with_savepoint", None) is not None:
            fut = job.stop_with_savepoint(None, savepoint=False)
        else:
            fut = _cancel(job)
        return accepted, {"request-id": server.start_operation("stop", fut)}, JSON
    raise ApiError(HTTPStatus.NOT_FOUND, f"no POST on /{'/'.join(parts)}")


# ------------------------------------------------------------------------------- helpers
def _check_job(server: RestServer, name: str) -> None:
    if name != server.job.job_name:
        raise ApiError(HTTPStatus.NOT_FOUND, f"no job {name!r} here; this server runs job {server.job.job_name!r}")


def _int_id(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"checkpoint id must be an integer, got {raw!r}") from None


def _only(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"unknown field(s) {', '.join(unknown)}; "
                       f"allowed: {', '.join(sorted(allowed)) or 'none'}")


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{key} must be a non-empty string (a path or URL)")
    return value


def _call(job: Any, name: str, target: str | None, **options: Any) -> Future:
    method = getattr(job, name, None)
    if method is None:
        raise ApiError(HTTPStatus.NOT_IMPLEMENTED, f"this sparkpoint version cannot {name.replace('_', ' ')} yet")
    try:
        return method(target, **options)  # refuses a target outside the allowed places first
    except ConfigError as e:
        raise ApiError(HTTPStatus.FORBIDDEN, str(e)) from None


def _cancel(job: Any) -> Future:
    """Stop without a savepoint where the job has no stop_with_savepoint: done once the
    job reached a terminal status."""
    fut: Future = Future()

    def on_status(old: Any, new: Any, error: Any) -> None:
        if new.terminal and not fut.done():
            fut.set_result(None)

    job.status.add_listener(on_status)
    job.cancel()
    if job.status.status.terminal and not fut.done():
        fut.set_result(None)
    return fut


def checkpoints_view(server: RestServer) -> dict[str, Any]:
    stats = server.job.coordinator.stats
    snap = stats.snapshot()
    messages = server.observer.failure_messages()
    history = stats.history()
    for entry in history:
        if entry["id"] in messages:
            entry["failure_message"] = f"{entry.get('failure_message') or ''} {messages[entry['id']]}".strip()
    completed = next((h for h in history if h["status"] == "COMPLETED"), None)
    failed = next((h for h in history if h["status"] == "FAILED"), None)
    if completed is None and snap["last_completed_id"] is not None:
        completed = {"id": snap["last_completed_id"], "status": "COMPLETED",
                     "end_to_end_duration": snap["last_duration_ms"], "state_size": snap["last_size_bytes"]}
    if completed is not None:
        latest_data = server.job.coordinator.completed_store.latest()
        if latest_data is not None and latest_data.checkpoint_id == completed["id"]:
            completed = {**completed, "external_path": _checkpoint_path(server.job, completed["id"])}
    restored = snap.get("last_restored")
    return {
        "counts": {"restored": snap["restored"], "total": snap["triggered"], "in_progress": snap["in_progress"],
                   "completed": snap["completed"], "failed": snap["counted_failed"], "aborted": snap["aborted"],
                   "declined": snap["declined"]},
        "failures_by_reason": snap["failures_by_reason"],
        "summary": stats.summary(),
        "latest": {"completed": completed, "failed": failed,
                   "restored": ({"id": restored["id"], "restore_timestamp": restored["restore_timestamp"],
                                 "external_path": restored.get("external_path")
                                 or _checkpoint_path(server.job, restored["id"])} if restored else None)},
        "history": history,
    }


def _checkpoint_path(job: Any, checkpoint_id: int) -> str | None:
    try:
        return mask_url(f"{job.storage.layout.root.rstrip('/')}/chk-{checkpoint_id}")
    except Exception:
        return None


def checkpoint_details(server: RestServer, checkpoint_id: int) -> dict[str, Any]:
    job = server.job
    entry = job.coordinator.stats.details(checkpoint_id)
    retained = {c.checkpoint_id: c for c in job.coordinator.completed_store.all()}
    if entry is None and checkpoint_id not in retained:
        raise ApiError(HTTPStatus.NOT_FOUND, f"checkpoint {checkpoint_id} is not in the job's recent history")
    if entry is None:
        data = retained[checkpoint_id]
        entry = {"id": checkpoint_id, "status": "COMPLETED", "trigger_timestamp": data.trigger_timestamp_ms,
                 "end_to_end_duration": data.completion_timestamp_ms - data.trigger_timestamp_ms,
                 "participants": []}
    acked = {p["id"] for p in entry["participants"]}
    data = retained.get(checkpoint_id)
    if data is not None:
        # Participants known from the checkpoint's metadata but whose acks the statistics
        # did not see (e.g. a checkpoint restored from storage).
        for name in sorted(set(data.handles) - acked):
            entry["participants"].append({"id": name, "ack_timestamp": None, "bytes": None,
                                          "sync_duration": None, "async_duration": None,
                                          "end_to_end_duration": None})
        entry["external_path"] = _checkpoint_path(job, checkpoint_id)
    message = server.observer.failure_messages().get(checkpoint_id)
    if message:
        entry["failure_message"] = f"{entry.get('failure_message') or ''} {message}".strip()
    return entry


def config_view(job: Any) -> dict[str, Any]:
    s = job.settings
    values = {}
    for name, field in type(s).model_fields.items():
        key = field.alias or name
        value = getattr(s, name)
        values[key] = masked(key, value)
    return {"jid": job.job_name, "name": job.job_name, "run-id": job.run_id, "execution-config": values}
