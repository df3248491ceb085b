"""``model.plan``: which model routes a step tries, in order.

Input::

    {"session": str,
     "purpose": "turn" | "summary" | "test",
     "directed": bool,              # the step answers a DM, a mention or the operator
     "routes": [{"name": str, "model": str, "dialect": str,
                 "down": bool,      # resting after a transient failure
                 "down_seconds": float (optional)}, ...],
     "default": [name, ...]}        # agent.route, then agent.fallback

Output::

    {"routes": [name, ...],         # 1 to 8 configured routes, none twice
     "reason": str}

The host sends the step to the first route of the answer that answers; a
route that fails transiently hands it to the next one. It validates the
answer and uses ``default`` instead when this hook raises, times out or
answers anything else, so a mistake here never stops the agent.

The default policy keeps the host's order. Edit it to spend differently: a
cheaper route for summaries, the best one when someone is waiting, for
example::

    if data["purpose"] == "summary" and "cheap" in names:
        return {"routes": ["cheap", *default], "reason": "summaries go cheap"}

The function is pure: it reads only its input, changes nothing and makes no
host requests.
"""

from . import _shape

PURPOSES = ("turn", "summary", "test")


def plan(data):
    """The ``model.plan`` slot."""
    _shape.mapping(data, "input")
    _shape.one_of(_shape.required(data, "purpose", "input"), PURPOSES, "input.purpose")
    _shape.boolean(_shape.required(data, "directed", "input"), "input.directed")
    raw = _shape.required(data, "routes", "input")
    if not isinstance(raw, list):
        raise ValueError(f"input.routes must be a list, got {type(raw).__name__}")
    names = set()
    for i, r in enumerate(raw):
        _shape.mapping(r, f"input.routes[{i}]")
        names.add(_shape.string(_shape.required(r, "name", f"input.routes[{i}]"), f"input.routes[{i}].name"))
    default = _shape.required(data, "default", "input")
    if not isinstance(default, list) or not default:
        raise ValueError("input.default must be a non-empty list of route names")
    for i, name in enumerate(default):
        _shape.string(name, f"input.default[{i}]")
        if name not in names:
            raise ValueError(f"input.default[{i}] names {name!r}, which is not in input.routes")
    return {"routes": list(default), "reason": "default: agent.route, then agent.fallback"}
