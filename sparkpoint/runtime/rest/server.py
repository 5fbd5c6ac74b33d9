"""One HTTP server per running job, shaped after Flink's REST API.

    GET  /jobs/overview                         status, throughput, lag, watermark
    GET  /jobs/<job>                            the same for one job
    GET  /jobs/<job>/checkpoints                counts, summary, latest, history
    GET  /jobs/<job>/checkpoints/details/<id>   one checkpoint, per participant
    GET  /jobs/<job>/checkpoints/<request-id>   a triggered checkpoint's outcome
    GET  /jobs/<job>/config                     the job's configuration keys
    GET  /jobs/<job>/exceptions                 failovers and checkpoint alarms
    POST /jobs/<job>/checkpoints                trigger one now -> request-id
    POST /jobs/<job>/savepoints                 {"target-directory": ...} -> request-id
    POST /jobs/<job>/stop                       {"drain"?, "savepoint"?, "target-directory"?} -> request-id
    GET  /jobs/<job>/savepoints/<request-id>    a savepoint's / stop's outcome and location
    GET  /metrics                               Prometheus, the job's one registry
    GET  /                                      the dashboard (static files in ./static)

`http.server`'s ThreadingHTTPServer: a handful of operators and one scraper, on
loopback unless configured otherwise (then with a bearer token for every request but
GET /metrics, which holds nothing secret and is scraped without one).
Every POST needs the job's control token, JSON, a `Host` naming this server and no
foreign `Origin` (security.py). Handlers only read
the job's state or call its thread-safe entry points (trigger_checkpoint,
trigger_savepoint, stop_with_savepoint, cancel); the operations they start are kept
under this module's lock."""

from __future__ import annotations

import json
import logging
import mimetypes
import threading
import time
import uuid
from concurrent.futures import Future
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sparkpoint.redaction import mask_url
from sparkpoint.runtime.rest import security
from sparkpoint.runtime.rest.observer import JobObserver, RuntimeCollector

log = logging.getLogger(__name__)

_MAX_BODY = 64 * 1024
_KEPT_OPERATIONS = 100
# How long a stopping server waits for clients to fetch the outcome of operations that
# just finished (a stop-with-savepoint's location is the last thing the job says).
_LINGER_S = 5.0


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Operation:
    def __init__(self, kind: str, future: Future) -> None:
        self.kind = kind
        self.future = future
        self.fetched_done = False
        self.started_ms = int(time.time() * 1000)

    def to_json(self) -> dict[str, Any]:
        if not self.future.done():
            return {"status": {"id": "IN_PROGRESS"}, "kind": self.kind}
        self.fetched_done = True
        error = self.future.exception()
        if error is not None:
            return {"status": {"id": "COMPLETED"}, "kind": self.kind,
                    "operation": {"failure-cause": {"class": type(error).__name__, "message": mask_url(str(error))}}}
        result = self.future.result()
        op: dict[str, Any] = {}
        if self.kind == "checkpoint":
            op["checkpointId"] = getattr(result, "checkpoint_id", result)
        else:
            op["location"] = mask_url(result) if isinstance(result, str) else result
        return {"status": {"id": "COMPLETED"}, "kind": self.kind, "operation": op}


class RestServer:
    def __init__(self, job: Any, host: str = "127.0.0.1", port: int = 8081, token: str | None = None,
                 control_token: str | None = None) -> None:
        self.job = job
        self.token = token
        # What a POST must carry (besides `token`, if configured): see security.py.
        self.control_token = control_token or security.new_control_token()
        self.bind_host = host
        self.observer = JobObserver(job)
        self._collector = RuntimeCollector(self.observer)
        registry = job.coordinator.stats.registry
        self._registry = registry
        try:
            registry.register(self._collector)
            self._owns_collector = True
        except ValueError:  # a second server on the same job serves the first one's metrics
            self._owns_collector = False
        _declare_kafka_metrics(registry)
        self._lock = threading.Lock()
        self._closing = False
        self._operations: dict[str, _Operation] = {}
        self._httpd = _bind(host, port, self)
        self.host, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="sparkpoint-rest", daemon=True)
        self._thread.start()
        self._extra: list[ThreadingHTTPServer] = []
        self.token_file: Any = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def serve_metrics_on(self, port: int, host: str = "127.0.0.1") -> None:
        """`metrics.prometheus.port`: /metrics (only) on a second port as well."""
        httpd = _bind(host, port, self, metrics_only=True)
        self._extra.append(httpd)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                         name="sparkpoint-metrics", daemon=True).start()

    def close(self, linger_s: float = _LINGER_S) -> None:
        """Stop serving (after up to `linger_s` for callers still fetching an outcome).
        Idempotent: the job closes it when it ends, and whoever tidies up after the job
        may close it again, also while the first close is still under way."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        deadline = time.monotonic() + linger_s
        while time.monotonic() < deadline and self._unfetched():
            time.sleep(0.05)
        for httpd in [self._httpd, *self._extra]:
            httpd.shutdown()
            httpd.server_close()
        self.observer.close()
        if self.token_file is not None:
            security.remove_control_token(self.job.run_id)
        if self._owns_collector:
            self._registry.unregister(self._collector)

    def _unfetched(self) -> bool:
        with self._lock:
            return any(op.future.done() and not op.fetched_done and op.kind != "checkpoint"
                       for op in self._operations.values())

    # -- operations ----------------------------------------------------------------------
    def start_operation(self, kind: str, future: Future) -> str:
        request_id = uuid.uuid4().hex
        with self._lock:
            self._operations[request_id] = _Operation(kind, future)
            while len(self._operations) > _KEPT_OPERATIONS:
                self._operations.pop(next(iter(self._operations)))
        return request_id

    def operation(self, request_id: str, kinds: tuple[str, ...]) -> dict[str, Any]:
        with self._lock:
            op = self._operations.get(request_id)
            if op is None or op.kind not in kinds:
                raise ApiError(HTTPStatus.NOT_FOUND, f"no {'/'.join(kinds)} request {request_id!r} on this job")
            return op.to_json()


def _bind(host: str, port: int, server: RestServer, metrics_only: bool = False) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"server_ref": server, "metrics_only": metrics_only})
    try:
        httpd = ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        if port == 0:
            raise
        # Another job (or a Flink) on this machine has the port: the job matters more
        # than a fixed port, and the lease says where the server ended up.
        log.warning("REST port %s:%d is taken (%s); serving on a free port instead (see `sparkpoint status`)",
                    host, port, e)
        httpd = ThreadingHTTPServer((host, 0), handler)
    httpd.daemon_threads = True
    return httpd


def _declare_kafka_metrics(registry: Any) -> None:
    """The sources' counters (Kafka offset commits, bad input records) exist on the job's
    registry whichever source the job has, so dashboards and alerts find them."""
    from sparkpoint.connectors.files import malformed_counter

    malformed_counter(registry)
    try:
        from sparkpoint.connectors.kafka_source import KafkaSourceMetrics

        KafkaSourceMetrics.on(registry)
    except Exception as e:  # an optional extra must not stop the server
        log.debug("Kafka metrics not declared: %s", e)


def start_rest_server(job: Any) -> RestServer:
    s = job.settings
    server = RestServer(job, s.rest_bind_address, s.rest_port, s.rest_token)
    try:
        path = security.write_control_token(job.run_id, server.control_token)
        server.token_file = path
        log.info("job %s: the REST API's control token is in %s (readable by this user only)", job.job_name, path)
    except (OSError, ValueError) as e:
        log.warning("could not write the REST API's control token (%s): checkpoint, savepoint and stop "
                    "requests are refused%s; set %s to a directory of this user", e,
                    " unless they carry rest.token" if s.rest_token else "", security.RUNTIME_DIR_ENV)
    if s.metrics_port:
        server.serve_metrics_on(s.metrics_port, s.metrics_bind_address)
    log.info("job %s: REST API and dashboard on %s", job.job_name, server.address)
    try:
        job.storage.lease.publish_rest_address(server.address)
    except Exception as e:  # the job runs without; the next heartbeat records it
        log.warning("could not record the REST address in the lease yet (%s); `sparkpoint status` "
                    "finds the job once the next heartbeat writes it", e)
    return server


# ---------------------------------------------------------------------------------- HTTP
class _Handler(BaseHTTPRequestHandler):
    server_ref: RestServer
    metrics_only: bool
    server_version = "sparkpoint"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("rest: %s", mask_url(format % args))

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        try:
            raw = self._raw_body()
            if self.metrics_only and url.path != "/metrics":
                raise ApiError(HTTPStatus.NOT_FOUND, "this port serves /metrics only")
            self._check_caller(method, url.path, query)
            body = self._body(raw)
            from sparkpoint.runtime.rest import routes

            status, payload, content_type = routes.handle(self.server_ref, method, url.path, query, body)
        except ApiError as e:
            status, payload, content_type = e.status, {"errors": [str(e)]}, "application/json"
        except Exception as e:
            log.exception("REST %s %s failed", method, mask_url(self.path))
            status, payload = HTTPStatus.INTERNAL_SERVER_ERROR, {"errors": [f"{type(e).__name__}: {e}"]}
            content_type = "application/json"
        self._send(status, payload, content_type)

    def _raw_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {_MAX_BODY} bytes")
        return self.rfile.read(length) if length else b""

    def _body(self, raw: bytes) -> Any:
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"request body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, "request body must be a JSON object")
        return body

    def _check_caller(self, method: str, path: str, query: dict[str, list[str]]) -> None:
        """Refuses what a web page, another local user or a rebound DNS name could send;
        the order puts the cheapest and least revealing checks first."""
        server = self.server_ref
        if method in ("GET", "HEAD") and path == "/metrics":
            # Read by Prometheus, which sends no token and names the target however its
            # service discovery does. It holds counts, the job's name, split names and
            # failure reasons: nothing a token or the Host check would protect.
            return
        host = self.headers.get("Host")
        if not security.host_allowed(host, server.bind_host):
            raise ApiError(HTTPStatus.FORBIDDEN, f"Host {host!r} does not name this server; use "
                           f"{server.address} (a DNS name pointing at it is refused: DNS rebinding)")
        if "token" in query:
            raise ApiError(HTTPStatus.BAD_REQUEST, "a token in the URL is refused (URLs end up in logs and "
                           "browser history): send it as 'Authorization: Bearer <token>'")
        header = self.headers.get("Authorization", "")
        # The dashboard's own files hold nothing secret; the page asks for rest.token itself.
        page = method in ("GET", "HEAD") and (path == "/" or path.startswith("/static/"))
        if server.token and not page and not security.bearer_matches(header, server.token):
            raise ApiError(HTTPStatus.UNAUTHORIZED, "missing or wrong token: send 'Authorization: Bearer <rest.token>'")
        if method in ("GET", "HEAD"):
            return
        if not security.same_origin(self.headers.get("Origin"), host):
            raise ApiError(HTTPStatus.FORBIDDEN, f"Origin {self.headers.get('Origin')!r} is not this server: "
                           "control requests from other web pages are refused")
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise ApiError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                           f"control requests must be JSON (Content-Type: application/json), got {content_type or 'none'!r}")
        if not security.bearer_matches(header, server.control_token, server.token):
            where = server.token_file or security.control_token_path(server.job.run_id)
            raise ApiError(HTTPStatus.UNAUTHORIZED,
                           f"missing or wrong token: control requests need 'Authorization: Bearer <token>' with the "
                           f"job's control token (in {where}, readable by the job's user only; `sparkpoint "
                           f"checkpoint|savepoint|stop` send it){' or rest.token' if server.token else ''}")

    def _send(self, status: HTTPStatus, payload: Any, content_type: str) -> None:
        if isinstance(payload, (bytes, bytearray)):
            data = bytes(payload)
        else:
            data = json.dumps(payload, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def static_file(name: str) -> tuple[bytes, str]:
    """A dashboard file shipped in the package (sparkpoint/runtime/rest/static)."""
    if not name or "/" in name or name.startswith("."):
        raise ApiError(HTTPStatus.NOT_FOUND, f"no such file: {name!r}")
    res = resources.files("sparkpoint.runtime.rest").joinpath("static", name)
    if not res.is_file():
        raise ApiError(HTTPStatus.NOT_FOUND, f"no such file: {name!r}")
    return res.read_bytes(), mimetypes.guess_type(name)[0] or "application/octet-stream"


def metrics_page(server: RestServer) -> tuple[bytes, str]:
    return generate_latest(server._registry), CONTENT_TYPE_LATEST


