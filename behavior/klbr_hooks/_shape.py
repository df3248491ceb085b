"""Input checks shared by the hooks. Every failure is a ValueError naming the
field, so the host's record of a failed invocation says what was wrong."""

import math


def mapping(value, where):
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object, got {type(value).__name__}")
    return value


def required(obj, key, where):
    if key not in obj:
        raise ValueError(f"{where}.{key} is required")
    return obj[key]


def string(value, where):
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {type(value).__name__}")
    return value


def optional_string(value, where):
    return None if value is None else string(value, where)


def boolean(value, where):
    if not isinstance(value, bool):
        raise ValueError(f"{where} must be true or false, got {type(value).__name__}")
    return value


def integer(value, where):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an integer, got {type(value).__name__}")
    return value


def timestamp(value, where):
    """A unix time in seconds: a finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number (unix seconds), got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be a finite, non-negative unix time, got {value!r}")
    return float(value)


def one_of(value, choices, where):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{where} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value
