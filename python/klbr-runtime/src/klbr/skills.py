"""The skills this kernel generation offers: instruction bodies, by id.

    import klbr.skills as skills
    dir(skills)               # the offered ids, and nothing else
    help(skills.workspace)    # read one body (also skills.workspace.body)
    skills.refused            # {id: reason}: found and not offered
    skills.revision           # content identity of the offered set
    skills.roots              # where the host read them from

The host reads and validates the skill roots and hands the set to the worker
at spawn, as the JSON file named by ``KLBR_SKILLS_FILE``::

    {"revision": str, "roots": [str, ...], "skills": {id: body}, "refused": {id: reason}}

It is read once, at the first attribute access, and cannot change under a
running generation: a skill written now is offered by the next one. Without
``KLBR_SKILLS_FILE`` the set is empty and ``revision`` is "". A file that
cannot be read or has another shape gives an empty set and a RuntimeWarning.
An id that is not an identifier (``code-review``), or one that is also a name
here (``revision``, ``roots``, ``refused``, ``get``), is read with
``skills.get(id)``.
"""


_RESERVED = frozenset(("revision", "roots", "refused", "get"))


def _attr_ok(skill_id):
    """Whether ``skills.<skill_id>`` reaches the skill."""
    import keyword
    return (skill_id.isidentifier() and not keyword.iskeyword(skill_id)
            and not skill_id.startswith("__") and skill_id not in _RESERVED)


def _summary(body, limit=72):
    lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    text = lines[0] if lines else ""
    return text if len(text) <= limit else text[:limit - 1] + "…"


class _Skill:
    """One offered skill: ``id`` and ``body``. ``help()`` on it prints the
    body, ``str()``/``repr()`` are one line."""

    def __init__(self, skill_id, body):
        self.id = skill_id
        self.body = body
        self.__name__ = skill_id
        self.__doc__ = body  # what help() and pydoc print

    def __repr__(self):
        how = f"skills.{self.id}" if _attr_ok(self.id) else f"skills.get({self.id!r})"
        return f"<skill {self.id!r}: {_summary(self.body)} ({len(self.body)} chars; help({how}))>"

    __str__ = __repr__


_Skill.__name__ = _Skill.__qualname__ = "Skill"
_Skill.__module__ = __name__


class _Set:
    __slots__ = ("revision", "roots", "skills", "refused", "problem")

    def __init__(self, revision="", roots=(), skills=None, refused=None, problem=None):
        self.revision, self.roots, self.problem = revision, tuple(roots), problem
        self.skills = {k: _Skill(k, v) for k, v in sorted((skills or {}).items())}
        self.refused = dict(sorted((refused or {}).items()))


_set = None


def _str_map(v):
    return isinstance(v, dict) and all(isinstance(k, str) and k and isinstance(x, str) for k, x in v.items())


def _read(path):
    if not path:
        return _Set()
    import json
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        return _Set(problem=f"KLBR_SKILLS_FILE {path!r} could not be read: {e}")
    if not (isinstance(data, dict) and isinstance(data.get("revision", ""), str)
            and isinstance(data.get("roots", []), list) and all(isinstance(r, str) for r in data.get("roots", []))
            and _str_map(data.get("skills", {})) and _str_map(data.get("refused", {}))):
        return _Set(problem=f"KLBR_SKILLS_FILE {path!r} does not have the shape "
                            '{"revision": str, "roots": [str], "skills": {id: body}, "refused": {id: reason}}')
    return _Set(data.get("revision", ""), data.get("roots", []), data.get("skills"), data.get("refused"))


def _load():
    global _set
    s = _set
    if s is None:
        import os
        s = _read(os.environ.get("KLBR_SKILLS_FILE", ""))
        _set = s
        if s.problem:
            import warnings
            warnings.warn(f"{s.problem}; no skills are offered", RuntimeWarning, stacklevel=3)
    return s


def get(skill_id):
    """The skill ``skill_id`` (any id, also one that is not an identifier)."""
    s = _load()
    try:
        return s.skills[skill_id]
    except (KeyError, TypeError):
        pass
    raise AttributeError(_missing(s, skill_id), name=skill_id if isinstance(skill_id, str) else None)


def _missing(s, name):
    if name in s.refused:
        return f"skill {name!r} was refused: {s.refused[name]}"
    if s.problem:
        return f"no skill {name!r}: {s.problem}"
    offered = ", ".join(s.skills) or "none"
    return f"no skill {name!r} in this generation (offered: {offered})"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}", name=name)
    s = _load()
    if name == "revision":
        return s.revision
    if name == "roots":
        return list(s.roots)
    if name == "refused":
        return dict(s.refused)
    try:
        return s.skills[name]
    except KeyError:
        pass
    import sys
    raise AttributeError(_missing(s, name), name=name, obj=sys.modules[__name__])


def __dir__():
    return list(_load().skills)
