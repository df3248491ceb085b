"""Change your own behavior: draft, edit, publish, activate, roll back.

- ``await behavior.status()``: the active release, a Record
  ``{epoch, release, history: [{epoch, release, kind, reason, activated_at}],
  validation}``: ``validation`` is the host's report of the active release
  (``ok``, ``refused``, ``suite``, ``slots``, ``replay`` with every changed
  decision, ``own_tests`` (recorded, not authoritative), ``environment``).
- ``d = await behavior.draft()``: a writable copy of the active release's tree
  (a Draft: ``d.id``, ``d.path``, ``d.parent_epoch``, ``d.read(relpath)``,
  ``await d.write(relpath, text)``, ``await d.replace(relpath, old, new)``,
  ``d.files()``).
- ``pub = await behavior.publish(d)``: an immutable release, a Record
  ``{release, kind, files, skills}``.
- ``await behavior.diff(d)``: the draft's diff against its release, a Record
  ``{diff, truncated, parent_release}`` (the host diffs the draft's files
  against the release it was drafted from; git never runs in the draft).
- ``await behavior.rebase(d)``: bring a stale draft onto the current release,
  three-way; a Record ``{rebased, conflicts, taken, merged, parent_epoch}``
  (conflicts are reported and change nothing).
- ``await behavior.activate(pub, expected_epoch=None, reason="")`` and
  ``await behavior.rollback()``: a Record
  ``{epoch, release, kind, replaced, workbench_reset_pending}``.

A Record is a dict whose keys also read as attributes (``pub.release``). The
host's refusals raise klbr.HostError. The implementation (klbr._behavior)
loads on first use. Read ``help(skills.maintenance)`` for the workflow.
"""

__all__ = ["status", "draft", "publish", "activate", "rollback", "diff", "rebase", "Draft", "Record", "DraftEscape"]


def __getattr__(name):
    if name in __all__:
        from . import _behavior
        value = getattr(_behavior, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}", name=name)


def __dir__():
    # Without the two hooks themselves, which help() would list as functions.
    return sorted((set(globals()) | set(__all__)) - {"__getattr__", "__dir__"})
