"""``execution.review``: allow or hold one cell before it runs.

Input::

    {"session": str, "code": str, "call": str, "step": int, "attempt": int}

Output::

    {"decision": "allow" | "hold", "reason": str}

A held cell never runs; the model gets a ``held`` result with the reason.
When this hook fails the host allows the cell, unless settings.toml lists
``execution.review`` in ``[hooks] required``: then it holds (fails closed).
The default policy allows every cell.
"""

from . import _shape


def review(data):
    """The ``execution.review`` slot."""
    _shape.mapping(data, "input")
    _shape.string(_shape.required(data, "code", "input"), "input.code")
    _shape.string(_shape.required(data, "session", "input"), "input.session")
    return {"decision": "allow", "reason": "default policy: cells run"}
