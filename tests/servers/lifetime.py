"""What every test server process shares: a free port on 127.0.0.1, and a child that
dies with the test process, so a crashed or killed test run leaves no server behind."""

from __future__ import annotations

import ctypes
import signal
import socket
import sys
from typing import Callable


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child before exec: Linux sends it SIGTERM when the process that started it dies.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen (None where it does not apply)."""
    return _die_with_parent if sys.platform == "linux" else None
