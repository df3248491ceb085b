"""Small helpers shared by both roles: bounded text and exception records."""

import os
import sys

RUNTIME_DIR = os.path.dirname(__file__) + os.sep  # co_filename of runner frames starts with this

MESSAGE_LIMIT = 16 * 1024
TRACEBACK_LIMIT = 64 * 1024
_TRACEBACK_HEAD = 8 * 1024


def utf8_cut(b, limit):
    """The largest prefix length <= limit of UTF-8 bytes b that ends on a character boundary."""
    cut = limit
    while cut > 0 and (b[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut


def bound_text(s, limit):
    """Return (text, truncated): s cut so that its UTF-8 form is at most limit bytes."""
    if len(s) * 4 <= limit:
        return s, False
    b = s.encode("utf-8", "surrogatepass")
    if len(b) <= limit:
        return s, False
    return b[:utf8_cut(b, limit)].decode("utf-8", "surrogatepass"), True


def bound_middle(s, limit, head=_TRACEBACK_HEAD):
    """Cut the middle out of s (UTF-8 bytes over limit), keeping its head and its tail."""
    if len(s) * 4 <= limit:
        return s
    b = s.encode("utf-8", "surrogatepass")
    if len(b) <= limit:
        return s
    marker = f"\n[... {len(b) - limit} bytes omitted ...]\n".encode()
    h = utf8_cut(b, head)
    tail_len = limit - h - len(marker) - 16
    start = len(b) - tail_len
    while start < len(b) and (b[start] & 0xC0) == 0x80:
        start += 1
    return (b[:h] + marker + b[start:]).decode("utf-8", "surrogatepass")


def exception_name(t):
    """A readable name for an exception type: ``ValueError``, ``asyncio.CancelledError``,
    ``json.JSONDecodeError`` (the public package name when it exports the type)."""
    mod = getattr(t, "__module__", None) or ""
    qual = getattr(t, "__qualname__", None) or getattr(t, "__name__", "Exception")
    if mod in ("builtins", "__main__", ""):
        return qual
    top = mod.partition(".")[0]
    if top != mod and getattr(sys.modules.get(top), qual, None) is t:
        return f"{top}.{qual}"
    return f"{mod}.{qual}"


def _trimmed(te):
    """Drop the runner's own frames from both ends of a TracebackException's
    stack (the cell wrapper at the top, the signal handler or request plumbing
    at the bottom); frames in between, and the SDK's, stay."""
    stack = te.stack
    i, j = 0, len(stack)
    while i < j and stack[i].filename.startswith(RUNTIME_DIR):
        i += 1
    while j > i and stack[j - 1].filename.startswith(RUNTIME_DIR):
        j -= 1
    if i or j != len(stack):
        te.stack = type(stack).from_list(stack[i:j])
    return te


def error_info(e, only=False, prefix=None):
    """``{type, message, traceback}`` for exception e, bounded, with runner frames trimmed.
    ``only``: format just the exception (SyntaxError and friends)."""
    import traceback
    t = type(e)
    try:
        message = str(e)
    except Exception:
        message = f"<{t.__name__}.__str__ failed>"
    if prefix:
        message = f"{prefix}: {message}" if message else prefix
    try:
        if only:
            text = "".join(traceback.format_exception_only(t, e))
        else:
            text = "".join(_trimmed(traceback.TracebackException(t, e, e.__traceback__, compact=True)).format())
    except Exception as fe:  # a broken __str__/__repr__ somewhere in the chain
        text = f"<the traceback could not be formatted: {fe!r}>"
    return {
        "type": exception_name(t),
        "message": bound_text(message, MESSAGE_LIMIT)[0],
        "traceback": bound_middle(text, TRACEBACK_LIMIT),
    }
