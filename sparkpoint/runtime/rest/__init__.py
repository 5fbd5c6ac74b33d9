"""The running job's REST API, web dashboard and Prometheus endpoint, on one HTTP server
(docs/operations.md).

It lives in the runtime because the JobMaster starts it and the layering forbids the
runtime to reach up into `ops`; the CLI (`sparkpoint status|checkpoint|savepoint|stop`,
sparkpoint/ops/control_cli.py) talks to it over HTTP only."""

from sparkpoint.runtime.rest.server import RestServer, start_rest_server

__all__ = ["RestServer", "start_rest_server"]
