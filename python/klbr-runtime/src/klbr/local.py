"""``await local.send(text)``: deliver text to the operator's local lane and
return the host's receipt. Printing is scratch output, never speech."""

from ._sdk import send

__all__ = ["send"]
