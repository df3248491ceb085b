"""``delivery.review``: allow or hold one explicit send before it is delivered.

Input::

    {"channel": "local" | "discord",
     "kind": "send" | "react" (optional, default send),
     "text": str (a reaction's emoji),
     "target_message_id": str (optional; the message a reaction goes on),
     "destination": str (optional; a Discord conversation),
     "session": str,
     "frame": {...} (optional; the attention frame the send belongs to)}

Output::

    {"decision": "allow" | "hold", "reason": str}

The default policy allows every send and reaction, except one with no
visible text (empty or only whitespace), which is held. The host fails closed: if this hook
raises, returns anything else, or misses its deadline, the send is held. Input
that does not have the shape above raises ValueError, and so is held too.
"""

from . import _shape

CHANNELS = ("local", "discord")
KINDS = ("send", "react")


def review(data):
    """The ``delivery.review`` slot."""
    _shape.mapping(data, "input")
    channel = _shape.one_of(_shape.required(data, "channel", "input"), CHANNELS, "input.channel")
    text = _shape.string(_shape.required(data, "text", "input"), "input.text")
    _shape.string(_shape.required(data, "session", "input"), "input.session")
    _shape.optional_string(data.get("destination"), "input.destination")
    kind = _shape.one_of(data.get("kind") or "send", KINDS, "input.kind")
    _shape.optional_string(data.get("target_message_id"), "input.target_message_id")
    frame = data.get("frame")
    if frame is not None:
        _shape.mapping(frame, "input.frame")

    if not text.strip():
        return {"decision": "hold",
                "reason": "the message is empty: there is nothing to say" if not text
                else "the message is only whitespace: there is nothing to say"}
    what = "reactions" if kind == "react" else "sends"
    return {"decision": "allow", "reason": f"default policy: {channel} {what} are allowed"}
