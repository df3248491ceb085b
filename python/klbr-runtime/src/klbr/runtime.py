"""``await runtime.wait(seconds=None, reason="")``: a terminal yield. The cell
ends with a ``yielded`` outcome once the host has recorded the wait; code
after the call does not run. 0 < seconds <= 600, or None."""

from ._sdk import WAIT_MAX_SECONDS, Yielded, wait

__all__ = ["wait", "Yielded", "WAIT_MAX_SECONDS"]
