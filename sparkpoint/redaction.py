"""Secrets never leave the job in clear: configuration values, URLs and request lines
pass through here before the REST API, the dashboard, the CLI or a log line shows them.

A key is secret when its name says so (`fs.s3a.secret.key`, `password`, `rest.token`,
`sasl.jaas.config`, an s3fs `key`/`secret`, a webhook URL, …); a URL is shown without
the user:password in it and without the values of secret-named query parameters."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "******"

_SECRET_KEY = re.compile(
    r"secret|passw|pwd|token|credential|auth|signature|jaas|webhook"
    r"|(access|private|api|account|encryption|sas)[._-]?key|(^|[._-])key$",
    re.IGNORECASE)
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
# Spark Connect's parameters, after the path: sc://host:port/;token=...;user_id=...
_CONNECT_PARAM = re.compile(r"(?<=;)([^;=/\s]+)=([^;\s]*)")


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def masked(key: str, value: Any) -> Any:
    """`value` as it may be shown: secret-named keys (at any depth of a mapping) masked,
    credentials in URLs removed."""
    if isinstance(value, dict):
        return {k: masked(str(k), v) for k, v in value.items()}
    if is_secret_key(key) and value not in (None, "", [], {}):
        return MASK
    if isinstance(value, (list, tuple)):
        return [masked(key, v) for v in value]
    if isinstance(value, str):
        return mask_url(value)
    return value


def mask_url(text: str) -> str:
    """A URL (or any text holding one) without user:password and secret query values."""
    text = _USERINFO.sub(MASK + "@", text)
    if "://" in text and "/;" in text:
        text = _CONNECT_PARAM.sub(lambda m: f"{m[1]}={MASK}" if is_secret_key(m[1]) else m[0], text)
    if "?" not in text or "://" not in text and not text.startswith("/"):
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not parts.query:
        return text
    query = [(k, MASK if is_secret_key(k) else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit(parts._replace(query=urlencode(query, safe="*")))
