"""Window kinds beyond tumbling (window.py): sliding, session and cumulate windows."""

from sparkpoint.api.windows.cumulate import CumulateWindow
from sparkpoint.api.windows.session import SessionWindow
from sparkpoint.api.windows.sliding import SlidingWindow
from sparkpoint.api.windows.state import FINAL, LATE, UPDATE

__all__ = ["SlidingWindow", "SessionWindow", "CumulateWindow", "FINAL", "UPDATE", "LATE"]
