"""Outside names (a Discord display name, username, channel name) as a cell
prints them: one double-quoted string with escapes, as the host's Go side
renders them (internal/outside.Name, which is Go's strconv.Quote). No name
can end the line it is printed on, start a "[klbr]" line or close its quotes.
"""

_SHORT = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
          "\\": "\\\\", '"': '\\"'}


def name(s):
    """``s`` quoted: printable characters (and the ASCII space) as they are,
    every other one (line and paragraph separators, controls, format
    characters) as an escape."""
    out = ['"']
    for ch in str(s):
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif ch == " " or ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)
