"""``await klbr.host.request(op, args)``: a typed request to the host (the
closed vocabulary of docs/worker-protocol.md). ``ok: false`` raises HostError."""

from ._sdk import HostError, NoExecutionScope, request

__all__ = ["request", "HostError", "NoExecutionScope"]
