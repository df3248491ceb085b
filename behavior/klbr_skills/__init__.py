"""Small helpers for working with skills from a cell.

A skill is ``skills/<id>/SKILL.md``: its first non-empty line is ``# <id>``
and its directory is named ``<id>``. That title is the whole schema. The host
reads and validates the skill roots; these helpers only apply the same rule to
text you already have (a draft you are writing, a mapping of bodies), so you
can check a skill before you publish it. They do no I/O.

    >>> skill_id("\\n# workspace\\nHow to ...")
    'workspace'
    >>> problems("workspace", "# workspace\\n...")
    []
    >>> ids({"discord": "# discord", "workspace": "# workspace"})
    ['discord', 'workspace']
"""

__all__ = ["skill_id", "problems", "ids"]


def skill_id(body):
    """The id a SKILL.md body declares in its title, or None when its first
    non-empty line is not ``# <id>``."""
    for line in body.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("# ") and line[2:].strip():
            return line[2:].strip()
        return None
    return None


def problems(dir_name, body):
    """What is wrong with ``body`` as the SKILL.md of directory ``dir_name``
    (an empty list when nothing is)."""
    found = skill_id(body)
    if found is None:
        return ["the first non-empty line must be '# <id>'"]
    if found != dir_name:
        return [f"the title says {found!r} but the directory is named {dir_name!r}"]
    return []


def ids(bodies):
    """The sorted skill ids of a mapping {id: SKILL.md body}, or ValueError
    naming every entry whose body does not declare its own id."""
    bad = {k: p for k, body in bodies.items() if (p := problems(k, body))}
    if bad:
        raise ValueError("; ".join(f"{k}: {', '.join(p)}" for k, p in sorted(bad.items())))
    return sorted(bodies)
