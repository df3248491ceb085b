"""The implementation behind ``klbr.behavior`` and ``klbr.hooks``.

Loaded on first use (the facades resolve their names lazily), so a worker that
never changes its behavior does not pay for it at start.

Every host call goes through ``klbr._sdk.request``: arguments are checked
before anything is sent, ``ok: false`` raises HostError, and the host's
result comes back as a Record (a dict whose keys also read as attributes).
A Draft's file helpers act only on regular files under the draft directory:
they walk it one component at a time without following symlinks, so neither
``..`` nor a symlink can lead them out of it (DraftEscape).
"""

import errno
import os

from ._sdk import DraftEscape, _fspath, request

HOOKS_INIT = "klbr_hooks/__init__.py"


class Record(dict):
    """A result from the host: a plain dict whose keys also read as attributes
    (``r.epoch`` is ``r["epoch"]``). Dicts inside a top-level list (history
    entries, trace invocations) are Records too."""

    __slots__ = ()

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            pass
        raise AttributeError(f"no field {name!r} in this reply; its fields are: "
                             f"{', '.join(map(str, self)) or '(none)'}", name=name, obj=self)

    def __dir__(self):
        return sorted(set(dir(dict)) | {k for k in self if isinstance(k, str) and k.isidentifier()})


Record.__module__ = "klbr.behavior"


def _record(result):
    if not isinstance(result, dict):
        return result
    return Record({k: [Record(x) if isinstance(x, dict) else x for x in v] if isinstance(v, list) else v
                   for k, v in result.items()})


def _check_str(value, what, empty_ok=False):
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not empty_ok and not value:
        raise ValueError(f"{what} must not be empty")
    return value


def _check_int(value, what, minimum):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value!r}")
    return value


def _release_id(release, what="release"):
    """A release id from a str, or from the result of behavior.publish()."""
    if isinstance(release, Draft):
        raise TypeError(f"{what} is a Draft; publish it first: pub = await behavior.publish(draft), "
                        f"then pass pub (or pub.release)")
    if isinstance(release, dict):
        release = release.get("release")
    return _check_str(release, what)


# -- drafts ------------------------------------------------------------------------

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_O_DIR_NOFOLLOW = _O_DIR | os.O_NOFOLLOW
_tmp_counter = 0


class Draft:
    """A writable copy of the active release's tree, from ``behavior.draft()``.

    ``id``, ``path`` (a pathlib.Path), ``parent_epoch``, ``parent_release``
    and ``raw`` (the host's reply). The helpers take paths relative to
    ``path`` and act on regular files under it only:

    - ``d.read(relpath)``: the text (UTF-8, newlines kept as they are).
    - ``await d.write(relpath, text)``: replace or create it (temporary file +
      rename, permission bits kept, parent directories created).
    - ``await d.replace(relpath, old, new)``: edit exactly one occurrence of
      ``old``, else ValueError with the count found.
    - ``d.files()``: every entry below ``path`` that is not a directory, as
      sorted relative paths (what publish will look at).

    An absolute path, ``..``, or a symlink anywhere on the way raises
    DraftEscape (a PermissionError).
    """

    __slots__ = ("id", "path", "parent_epoch", "parent_release", "raw")

    def __init__(self, draft_id, path, parent_epoch=None, parent_release=None, raw=None):
        from pathlib import Path
        self.id = draft_id
        self.path = Path(path)
        self.parent_epoch = parent_epoch
        self.parent_release = parent_release
        self.raw = raw

    @classmethod
    def from_reply(cls, r):
        if not isinstance(r, dict):
            raise TypeError(f"behavior.draft reply is {type(r).__name__}, not an object")
        draft_id, path = r.get("draft"), r.get("path")
        if not isinstance(draft_id, str) or not draft_id:
            raise ValueError(f"behavior.draft reply has no draft id: {r!r}")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise ValueError(f"behavior.draft reply has no absolute path: {r!r}")
        return cls(draft_id, path, r.get("parent_epoch"), r.get("parent_release"), _record(r))

    def __repr__(self):
        return (f"<Draft {self.id} at {str(self.path)!r} (parent epoch {self.parent_epoch}, "
                f"release {self.parent_release})>")

    def __fspath__(self):
        return str(self.path)

    # The walk: a directory fd per component, opened with O_NOFOLLOW.

    def _parts(self, relpath):
        p = _fspath(relpath, "relpath")
        if os.path.isabs(p):
            raise DraftEscape(f"{p!r} is absolute; draft paths are relative to the draft ({self.path})")
        parts = [c for c in p.split("/") if c not in ("", ".")]
        if ".." in parts:
            raise DraftEscape(f"{p!r} climbs out with '..'; draft paths stay under {self.path}")
        if not parts:
            raise IsADirectoryError(f"{p!r} is the draft directory itself, not a file")
        return p, parts

    def _open_parent(self, p, parts, create):
        """A directory fd for the parent of ``parts[-1]`` (the caller closes it)."""
        fd = os.open(self.path, _O_DIR)
        try:
            for i, name in enumerate(parts[:-1]):
                try:
                    nfd = os.open(name, _O_DIR_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise FileNotFoundError(errno.ENOENT, "no such file in the draft", p) from None
                    try:
                        os.mkdir(name, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                    nfd = os.open(name, _O_DIR_NOFOLLOW, dir_fd=fd)
                except OSError as e:
                    self._refuse_link(fd, name, p, parts[:i + 1])
                    if e.errno == errno.ENOTDIR:
                        raise NotADirectoryError(e.errno, "not a directory in the draft",
                                                 "/".join(parts[:i + 1])) from None
                    raise
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _refuse_link(dir_fd, name, p, at):
        import stat
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise DraftEscape(f"{p!r}: {'/'.join(at)!r} is a symlink; a draft may not contain symlinks "
                              "(publish refuses them)")

    def _read_bytes(self, relpath):
        import stat
        p, parts = self._parts(relpath)
        dfd = self._open_parent(p, parts, create=False)
        try:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                raise FileNotFoundError(errno.ENOENT, "no such file in the draft", p) from None
            except OSError:
                self._refuse_link(dfd, parts[-1], p, parts)
                raise
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory in the draft", p)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{p!r} is not a regular file")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return p, b"".join(chunks)
        finally:
            os.close(fd)

    def read(self, relpath):
        """The text of a file in the draft (UTF-8, newlines kept as they are)."""
        p, data = self._read_bytes(relpath)
        return data.decode("utf-8")

    async def write(self, relpath, text):
        """Replace (or create) a file in the draft: a temporary file, then a
        rename. An existing file keeps its permission bits."""
        if not isinstance(text, str):
            raise TypeError(f"write() takes a str, not {type(text).__name__}")
        self._write(relpath, text.encode("utf-8"))

    def _write(self, relpath, data):
        global _tmp_counter
        import stat
        p, parts = self._parts(relpath)
        name = parts[-1]
        dfd = self._open_parent(p, parts, create=True)
        try:
            try:
                st = os.lstat(name, dir_fd=dfd)
            except FileNotFoundError:
                mode = None
            else:
                if stat.S_ISLNK(st.st_mode):
                    raise DraftEscape(f"{p!r} is a symlink; a draft may not contain symlinks "
                                      "(publish refuses them)")
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(errno.EISDIR, "is a directory in the draft", p)
                if not stat.S_ISREG(st.st_mode):
                    raise OSError(f"{p!r} is not a regular file")
                mode = stat.S_IMODE(st.st_mode)
            _tmp_counter += 1
            tmp = f".{name}.klbr-{os.getpid()}-{_tmp_counter}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                         dir_fd=dfd)
            try:
                try:
                    view = memoryview(data)
                    off = 0
                    while off < len(view):
                        off += os.write(fd, view[off:])
                    if mode is not None:
                        os.fchmod(fd, mode)
                finally:
                    os.close(fd)
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
        finally:
            os.close(dfd)

    async def replace(self, relpath, old, new):
        """Replace exactly one occurrence of ``old`` with ``new`` in a draft
        file; ValueError (with the count found) otherwise."""
        if not isinstance(old, str) or not isinstance(new, str):
            raise TypeError("replace() takes two str")
        if not old:
            raise ValueError("replace(): the old text is empty")
        text = self.read(relpath)
        n = text.count(old)
        if n != 1:
            raise ValueError(f"{relpath}: replace() needs exactly one occurrence of the old text, found {n}")
        await self.write(relpath, text.replace(old, new, 1))

    def files(self):
        """Every entry below the draft that is not a directory (symlinked
        directories are listed, not followed), as sorted relative paths."""
        root = os.fspath(self.path)
        out = []
        stack = [("", root)]
        while stack:
            rel, d = stack.pop()
            with os.scandir(d) as it:
                for de in it:
                    r = rel + de.name
                    if de.is_dir(follow_symlinks=False):
                        stack.append((r + "/", de.path))
                    else:
                        out.append(r)
        out.sort()
        return out


# -- behavior ----------------------------------------------------------------------


async def status():
    """``behavior.status``: the active release of this session. A Record
    ``{epoch, release, history: [{epoch, release, kind, reason, activated_at}],
    validation}``: ``validation`` is the host's report of the active release
    (``ok``, ``refused``, ``suite``, ``slots``, ``replay``, ``own_tests``,
    ``environment``), or None."""
    return _record(await request("behavior.status", {}))


async def draft():
    """``behavior.draft``: a writable copy of the active release's tree. Returns
    a Draft (``id``, ``path``, ``parent_epoch``, ``parent_release``, and the
    file helpers ``read``, ``write``, ``replace``, ``files``)."""
    return Draft.from_reply(await request("behavior.draft", {}))


async def publish(draft_or_id):
    """``behavior.publish``: copy a draft into an immutable, content-addressed
    release. Takes a Draft or a draft id; returns a Record
    ``{release, kind, files, skills}`` (pass it, or its ``release``, to activate)."""
    if isinstance(draft_or_id, Draft):
        draft_id = draft_or_id.id
    else:
        draft_id = _check_str(draft_or_id, "draft (a Draft or a draft id)")
    return _record(await request("behavior.publish", {"draft": draft_id}))


async def activate(release, expected_epoch=None, reason=""):
    """``behavior.activate``: make a published release the active one. The host
    validates it in a fresh process first and refuses a failing candidate.

    ``release``: a release id, or the result of ``publish``. ``expected_epoch``:
    the epoch you expect to replace; None lets the host use the parent epoch of
    the draft the release came from (else the current one), so activating over
    a revision that changed since the draft is refused. Returns a Record
    ``{epoch, release, kind, replaced, workbench_reset_pending}``.
    """
    release = _release_id(release)
    args = {"release": release}
    if expected_epoch is not None:
        args["expected_epoch"] = _check_int(expected_epoch, "expected_epoch", 0)
    args["reason"] = _check_str(reason, "reason", empty_ok=True)
    return _record(await request("behavior.activate", args))


async def rollback():
    """``behavior.rollback``: return to the previous release. Returns a Record
    ``{epoch, release, kind, replaced, workbench_reset_pending}``. It changes
    future behavior only: nothing sent or written is undone."""
    return _record(await request("behavior.rollback", {}))


def _draft_id(draft_or_id, op):
    if isinstance(draft_or_id, Draft):
        return draft_or_id.id
    return _check_str(draft_or_id, f"{op}: draft (a Draft or a draft id)")


async def diff(draft_or_id):
    """``behavior.diff``: the unified diff of a draft against the release it
    is based on (its git HEAD), new and deleted files included. A Record
    ``{draft, parent_release, diff, truncated}`` (``diff`` is bounded)."""
    return _record(await request("behavior.diff", {"draft": _draft_id(draft_or_id, "diff")}))


async def rebase(draft_or_id):
    """``behavior.rebase``: bring a stale draft onto the session's current
    release, three-way, file by file. A Record ``{draft, rebased,
    from_release, onto_release, parent_epoch, taken, merged, conflicts:
    [{path, reason, merged}]}``. With any conflict nothing is changed:
    ``conflicts`` says where (``merged`` shows git's conflict markers); edit
    the draft and rebase again, or draft anew. A rebased Draft object still
    holds the old ``parent_epoch``: activate with the returned one."""
    return _record(await request("behavior.rebase", {"draft": _draft_id(draft_or_id, "rebase")}))


# -- hooks -------------------------------------------------------------------------


def _check_slot(slot):
    _check_str(slot, "slot")
    if any(c.isspace() or c in "\"'\\" for c in slot):
        raise ValueError(f"slot {slot!r} is not a slot name such as 'delivery.review'")
    return slot


async def hooks_list():
    """``hooks.list``: every slot (decision, transform, observer) with its
    kind, input and output shapes, deadline, failure contract, default and the
    handlers the active release binds. A Record
    ``{release, epoch, slots: [...]}``."""
    return _record(await request("hooks.list", {}))


async def hooks_describe(slot):
    """``hooks.describe``: a slot's documentation and contract. A Record
    ``{slot, doc, contract}``."""
    return _record(await request("hooks.describe", {"slot": _check_slot(slot)}))


async def hooks_test(slot, input, release=None, handler=None):
    """``hooks.test``: call a slot with ``input`` (a dict) in a fresh hook
    worker with fake effects (nothing it answers is carried out; an
    observer's commands are only returned), from ``release`` (a release id or
    a publish result; None for the active one). ``handler`` names one handler
    of a transform chain or an observer (a key of SLOTS) instead of the slot's
    own. A Record ``{ok, outcome, result | error, latency_ms, valid,
    invalid}``: ``valid`` is the host's own reading of the answer (what it
    would use or refuse)."""
    args = {"slot": _check_slot(slot)}
    if not isinstance(input, dict):
        raise TypeError(f"input must be a dict (the hook's input object), not {type(input).__name__}")
    args["input"] = input
    if release is not None:
        args["release"] = _release_id(release)
    if handler is not None:
        args["handler"] = _check_slot(handler)
    return _record(await request("hooks.test", args))


async def hooks_trace(limit=20, inputs=False):
    """``hooks.trace``: the most recent hook invocations (at most 500), newest
    first. A Record ``{invocations: [{id, at, slot, release, epoch, outcome,
    fallback, latency_ms, error, input_ref, input_kept, result}]}``: ``at`` is
    an RFC 3339 time, ``input_ref`` the digest of the invocation's input, and
    ``input_kept`` whether the (bounded) input itself is stored for replay.
    ``inputs=True`` adds each stored ``input``."""
    args = {"limit": _check_int(limit, "limit", 1)}
    if inputs:
        args["inputs"] = True
    return _record(await request("hooks.trace", args))


async def hooks_bind(draft, slot, module, function):
    """Point ``SLOTS[slot]`` at ``klbr_hooks/<module>.py``'s ``function`` in a
    draft. An edit of ``klbr_hooks/__init__.py``, made only in this shape:

    - ``SLOTS`` must be one top-level dict literal with string keys
      (``SLOTS = {"attention.plan": plan, ...}``), else nothing is changed;
    - the slot's value expression is replaced by ``<module>.<function>`` (a new
      slot is added after the last entry), keys, comments and layout kept;
    - ``from . import <module>`` is added after the last import above SLOTS
      unless the file already has it; an import that ``<module>`` no longer
      needs is left in place.

    ``module`` is a module directly in ``klbr_hooks`` (``<module>.py`` or a
    package) and must define ``function`` at top level. The new file must
    parse. Nothing host-side happens: publish, ``hooks.test`` and activate as
    usual. Returns a Record ``{path, slot, value, previous, import_added}``.
    """
    if not isinstance(draft, Draft):
        raise TypeError("bind() edits a draft: pass the Draft from await behavior.draft()")
    import ast
    import keyword
    _check_slot(slot)
    for value, what in ((module, "module"), (function, "function")):
        if not isinstance(value, str) or not value.isidentifier() or keyword.iskeyword(value):
            raise ValueError(f"{what} must be a Python identifier, got {value!r}")
    for rel in (f"klbr_hooks/{module}.py", f"klbr_hooks/{module}/__init__.py"):
        try:
            src = draft.read(rel)
            break
        except FileNotFoundError:
            continue
    else:
        raise FileNotFoundError(f"the draft has no module klbr_hooks/{module}.py (or package "
                                f"klbr_hooks/{module}/); write it first")
    if function not in _top_level_names(ast.parse(src, rel)):
        raise ValueError(f"{rel} defines no top-level {function!r}")

    text = draft.read(HOOKS_INIT)
    new_text, previous, import_added = _rebind(text, slot, module, function)
    await draft.write(HOOKS_INIT, new_text)
    return Record(path=HOOKS_INIT, slot=slot, value=f"{module}.{function}", previous=previous,
                  import_added=import_added)


def _top_level_names(tree):
    import ast
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


class _Source:
    """Text with ast positions (1-based line, UTF-8 byte column) as offsets."""

    def __init__(self, text):
        if "\r" in text.replace("\r\n", ""):
            raise ValueError(f"{HOOKS_INIT} has bare carriage returns; bind() edits only files with "
                             "\\n or \\r\\n line ends")
        self.text = text
        self.starts = [0]
        for line in text.split("\n")[:-1]:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def offset(self, lineno, col):
        start = self.starts[lineno - 1]
        end = self.text.find("\n", start)
        line = self.text[start:] if end < 0 else self.text[start:end]
        return start + len(line.encode("utf-8")[:col].decode("utf-8"))

    def line_start(self, lineno):
        return self.starts[lineno - 1] if lineno <= len(self.starts) else len(self.text)


def _rebind(text, slot, module, function):
    import ast
    refuse = (f"hooks.bind() edits only a top-level `SLOTS = {{\"slot\": handler, ...}}` dict literal "
              f"in {HOOKS_INIT}; ")
    tree = ast.parse(text, HOOKS_INIT)
    found = [n for n in tree.body
             if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                 and n.targets[0].id == "SLOTS")
             or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "SLOTS")]
    if len(found) != 1 or not isinstance(found[0].value, ast.Dict):
        raise ValueError(refuse + f"found {len(found)} assignments to SLOTS"
                         + ("" if len(found) != 1 else ", not a dict literal") + "; edit it by hand")
    assign, d = found[0], found[0].value
    if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in d.keys):
        raise ValueError(refuse + "its keys are not all string literals; edit it by hand")
    hits = [i for i, k in enumerate(d.keys) if k.value == slot]
    if len(hits) > 1:
        raise ValueError(refuse + f"{slot!r} appears {len(hits)} times; edit it by hand")

    # Is `module` already bound, and to what?
    import_present = False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
            for a in node.names:
                if (a.asname or a.name) == module:
                    if a.name != module:
                        raise ValueError(f"{HOOKS_INIT} binds {module!r} to .{a.name}; edit it by hand")
                    import_present = True
    if not import_present and module in _top_level_names(tree):
        raise ValueError(f"{HOOKS_INIT} already binds the name {module!r} to something other than "
                         f"the submodule .{module}; edit it by hand")

    src = _Source(text)
    value = f"{module}.{function}"
    edits = []  # (start, end, replacement), applied from the end
    previous = None
    if hits:
        v = d.values[hits[0]]
        a, b = src.offset(v.lineno, v.col_offset), src.offset(v.end_lineno, v.end_col_offset)
        previous = text[a:b]
        edits.append((a, b, value))
    elif d.keys:
        last_key, last = d.keys[-1], d.values[-1]
        # The entry ends after the value and the parentheses around it (an
        # ast node's span leaves them out).
        at = src.offset(last.end_lineno, last.end_col_offset)
        depth = text[src.offset(last_key.end_lineno, last_key.end_col_offset):
                     src.offset(last.lineno, last.col_offset)].count("(")
        while depth:
            close = text.find(")", at)
            if close < 0 or text[at:close].strip():
                raise ValueError(refuse + "the last entry's layout is not one this edit understands; edit it by hand")
            at, depth = close + 1, depth - 1
        eol = text.find("\n", at)
        brace = src.offset(d.end_lineno, d.end_col_offset) - 1
        if eol < 0 or brace < eol:
            # The closing brace is on the last entry's line: add inline.
            j = len(text[:brace].rstrip())
            edits.append((j, j, f" \"{slot}\": {value}" if text[j - 1] == "," else f", \"{slot}\": {value}"))
        else:
            # One entry per line: a new line after the last entry's (its
            # trailing comma and comment stay with it).
            indent = text[src.line_start(last_key.lineno):src.offset(last_key.lineno, last_key.col_offset)]
            if indent.strip():
                indent = "    "
            if not text[at:eol].lstrip().startswith(","):
                edits.append((at, at, ","))
            edits.append((eol + 1, eol + 1, f"{indent}\"{slot}\": {value},\n"))
    else:
        at = src.offset(d.lineno, d.col_offset) + 1  # just inside the `{`
        edits.append((at, at, f"\"{slot}\": {value}"))
    import_added = not import_present
    if import_added:
        before = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and n.end_lineno < assign.lineno]
        line = before[-1].end_lineno + 1 if before else assign.lineno
        at = src.line_start(line)
        stmt = f"from . import {module}\n"
        if at == len(text) and text and not text.endswith("\n"):
            stmt = "\n" + stmt
        edits.append((at, at, stmt))

    out = text
    for a, b, rep in sorted(edits, key=lambda e: e[0], reverse=True):
        out = out[:a] + rep + out[b:]

    # The result must parse and say what we meant.
    try:
        check = ast.parse(out, HOOKS_INIT)
    except SyntaxError as e:
        raise ValueError(f"hooks.bind() would leave {HOOKS_INIT} unparsable ({e}); nothing was changed") from None
    ok = False
    for n in check.body:
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(getattr(n, "value", None), ast.Dict):
            for k, v in zip(n.value.keys, n.value.values):
                if (isinstance(k, ast.Constant) and k.value == slot and isinstance(v, ast.Attribute)
                        and v.attr == function and isinstance(v.value, ast.Name) and v.value.id == module):
                    ok = True
    if not ok:
        raise ValueError(f"hooks.bind() could not place {slot!r}: {value} in {HOOKS_INIT}; nothing was changed")
    return out, previous, import_added


# What help() and reprs call these: the facade's names, not the internal ones.
Draft.__module__ = "klbr.behavior"
for _f in (status, draft, publish, activate, rollback, diff, rebase):
    _f.__module__ = "klbr.behavior"
for _f in (hooks_list, hooks_describe, hooks_test, hooks_trace, hooks_bind):
    _f.__module__ = "klbr.hooks"
    _f.__name__ = _f.__qualname__ = _f.__name__[len("hooks_"):]
del _f
