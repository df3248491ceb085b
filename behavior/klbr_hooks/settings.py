"""The behavior-owned settings the hooks read, from ``settings.toml`` at the
root of the behavior tree.

They are read once, at import: a release is immutable, so they cannot change
under a running hook worker. A missing file, invalid TOML, an unknown key in a
table the hooks own, or a value out of range raises ValueError, which fails the
import of ``klbr_hooks`` and so refuses the candidate instead of running it on
a guess. Tables the hooks do not own are left to their readers.
"""

import dataclasses
import math
import os
import tomllib

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "settings.toml")

AMBIENT_DEFER_MAX = 600


@dataclasses.dataclass(frozen=True)
class Settings:
    ambient_defer_seconds: float


def load(path=PATH):
    """Read and validate the settings file at ``path``."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"the behavior settings file {path} is missing") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path} is not valid TOML: {e}") from None
    return parse(doc, where=path)


def parse(doc, where="settings"):
    """Validate an already-parsed settings document (a dict)."""
    attention = doc.get("attention", {})
    if not isinstance(attention, dict):
        raise ValueError(f"{where}: [attention] must be a table")
    unknown = sorted(set(attention) - {"ambient_defer_seconds"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) in [attention]: {', '.join(unknown)}")
    defer = attention.get("ambient_defer_seconds")
    if defer is None:
        raise ValueError(f"{where}: [attention] ambient_defer_seconds is required")
    if isinstance(defer, bool) or not isinstance(defer, (int, float)) or not math.isfinite(defer):
        raise ValueError(f"{where}: [attention] ambient_defer_seconds must be a number, got {defer!r}")
    if not 0 <= defer <= AMBIENT_DEFER_MAX:
        raise ValueError(f"{where}: [attention] ambient_defer_seconds must be in "
                         f"[0, {AMBIENT_DEFER_MAX}], got {defer!r}")
    return Settings(ambient_defer_seconds=float(defer))


SETTINGS = load()
