"""The policy hooks the host calls (``klbr_hooks.SLOTS`` of a release).

- ``await hooks.list()``: ``{release, epoch, slots: [...], observers: [...]}``:
  every slot with its ``kind`` (decision, transform, observer), ``input`` and
  ``output`` shapes, ``deadline_ms``, ``failure`` contract, ``default`` and
  the ``handlers`` the active release binds to it.
- ``await hooks.describe(slot)``: one slot's entry, with ``doc`` and an
  ``example_input``.
- ``await hooks.test(slot, input, release=None, handler=None)``: call a slot
  (or one ``handler`` of a transform chain or an observer) with ``input`` (a
  dict) in a fresh hook worker with fake effects, from a published release (a
  release id or a ``behavior.publish`` result; None for the active one):
  ``{ok, outcome, result | error, latency_ms, valid, invalid}``.
- ``await hooks.trace(limit=20, inputs=False)``: recent invocations, newest
  first: ``{invocations: [{id, at, slot, release, epoch, outcome, fallback,
  latency_ms, error, input_ref, input_kept, result}]}`` (``inputs=True`` adds
  each stored input).
- ``await hooks.bind(draft, slot, module, function)``: in a draft, point
  ``SLOTS[slot]`` at ``klbr_hooks/<module>.py``'s ``function`` (a checked edit
  of ``klbr_hooks/__init__.py``; see ``help(hooks.bind)``).

Results are Records (dicts whose keys also read as attributes); the host's
refusals raise klbr.HostError. The implementation (klbr._behavior) loads on
first use.
"""

__all__ = ["list", "describe", "test", "trace", "bind"]


def __getattr__(name):
    if name in __all__:
        from . import _behavior
        value = getattr(_behavior, "hooks_" + name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}", name=name)


def __dir__():
    # Without the two hooks themselves, which help() would list as functions.
    return sorted((set(globals()) | set(__all__)) - {"__getattr__", "__dir__"})
