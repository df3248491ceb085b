"""Frames of the worker protocol (docs/worker-protocol.md).

A frame is a 4-byte big-endian length N followed by N bytes of one UTF-8 JSON
object, 1 <= N <= 1 MiB. Every malformed case raises a FrameError subclass
with a diagnostic; the connection is then abandoned, never resynchronized.
"""

import json
import os
import threading

MAX_FRAME = 1 << 20
HEADER = 4
_READ_CHUNK = 1 << 16

__all__ = [
    "MAX_FRAME", "FrameError", "FrameLengthError", "TruncatedFrameError",
    "FrameEncodingError", "FrameJSONError", "FrameNotObjectError",
    "encode_frame", "decode_body", "FrameReader", "FrameWriter", "write_all",
]


class FrameError(Exception):
    """A malformed frame: the stream cannot be trusted after it."""


class FrameLengthError(FrameError, ValueError):
    """A length of 0 or over MAX_FRAME (read or write)."""


class TruncatedFrameError(FrameError):
    """The stream ended inside a frame header or body."""


class FrameEncodingError(FrameError):
    """The frame body is not valid UTF-8."""


class FrameJSONError(FrameError):
    """The frame body is not valid JSON (or is nested too deeply)."""


class FrameNotObjectError(FrameError):
    """The frame body is valid JSON but not one object."""


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_encode_ascii = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode
_decode = json.JSONDecoder().decode


def encode_frame(obj):
    """Return the wire bytes (header + body) of one frame.

    Raises TypeError/ValueError for values JSON cannot carry (NaN included)
    and FrameLengthError when the body is over MAX_FRAME. Strings holding
    lone surrogates are sent with JSON \\u escapes so the body stays UTF-8.
    """
    if type(obj) is not dict:
        raise TypeError(f"a frame is a JSON object, not {type(obj).__name__}")
    text = _encode(obj)
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:
        body = _encode_ascii(obj).encode("ascii")
    n = len(body)
    if n > MAX_FRAME:
        raise FrameLengthError(f"frame of {n} bytes is over the {MAX_FRAME}-byte bound")
    return n.to_bytes(HEADER, "big") + body


def decode_body(body):
    """Decode one frame body (bytes) into a dict, or raise a FrameError."""
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as e:
        raise FrameEncodingError(f"frame body is not valid UTF-8: {e}") from None
    try:
        obj = _decode(text)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise FrameJSONError(f"frame body is not valid JSON: {e}") from None
    except RecursionError:
        raise FrameJSONError("frame body is JSON nested too deeply") from None
    if type(obj) is not dict:
        raise FrameNotObjectError(f"frame body is a JSON {type(obj).__name__}, not an object")
    return obj


class FrameReader:
    """Reads frames from ``read(n) -> bytes`` (b"" at end of stream).

    ``read_frame`` returns a dict, or None at a clean end of stream (between
    frames). The length is checked before any of the body is buffered.
    """

    __slots__ = ("_read", "_buf")

    def __init__(self, read):
        self._read = read
        self._buf = bytearray()

    @classmethod
    def from_fd(cls, fd):
        return cls(lambda n, _r=os.read, _fd=fd: _r(_fd, n))

    def read_frame(self):
        buf = self._buf
        read = self._read
        while len(buf) < HEADER:
            chunk = read(_READ_CHUNK)
            if not chunk:
                if not buf:
                    return None
                raise TruncatedFrameError(
                    f"stream ended inside a frame header ({len(buf)} of {HEADER} bytes)")
            buf += chunk
        n = int.from_bytes(buf[:HEADER], "big")
        if n == 0 or n > MAX_FRAME:
            raise FrameLengthError(f"frame length {n} is outside 1..{MAX_FRAME}")
        end = HEADER + n
        while len(buf) < end:
            chunk = read(max(_READ_CHUNK, end - len(buf)))
            if not chunk:
                raise TruncatedFrameError(
                    f"stream ended inside a {n}-byte frame ({len(buf) - HEADER} bytes read)")
            buf += chunk
        body = bytes(buf[HEADER:end])
        del buf[:end]
        return decode_body(body)


def write_all(fd, data):
    """Write all of ``data`` to ``fd`` (looping over partial writes)."""
    view = memoryview(data)
    total = len(view)
    off = os.write(fd, view)
    while off < total:
        off += os.write(fd, view[off:])


class FrameWriter:
    """Writes whole frames to a file descriptor; one lock serializes them."""

    __slots__ = ("fd", "lock")

    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()

    def write(self, obj):
        self.write_bytes(encode_frame(obj))

    def write_bytes(self, data):
        with self.lock:
            write_all(self.fd, data)
