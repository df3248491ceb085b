"""The one internal module behind the ``klbr`` SDK (klbr.host, klbr.local,
klbr.runtime, klbr.workspace are thin facades over it; klbr.behavior and
klbr.hooks load klbr._behavior on first use, and klbr.skills stands alone).

Host requests go through the workbench runner, which binds itself here with
``_bind``. Outside a workbench cell (the hooks role, a plain interpreter)
there is no effect scope and every host request raises NoExecutionScope.
The workspace file helpers work anywhere.
"""

import os

from klbr_runtime import SDK_VERSION

WAIT_MAX_SECONDS = 600

_runtime = None


def _bind(runtime):
    """Called by the workbench runner: ``runtime`` provides ``request(op, args)``
    and ``wait(seconds, reason)`` coroutines."""
    global _runtime
    _runtime = runtime


# -- errors ---------------------------------------------------------------------


class HostError(Exception):
    """The host refused or failed a request (``ok: false``): ``code`` is stable
    (``stale``, ``unsupported``, ``busy``, ...), ``message`` says why."""

    def __init__(self, code, message=""):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self):
        return f"{self.code}: {self.message}" if self.message else str(self.code)


class NoExecutionScope(RuntimeError):
    """A host request made where there is no execution to attribute it to
    (a hook, a thread, a plain interpreter)."""


class Yielded(BaseException):
    """Raised by ``runtime.wait()`` once the host accepted the wait. It ends the
    cell with a ``yielded`` outcome: code after the wait does not run. It is a
    BaseException so that ``except Exception`` does not swallow it."""

    def __init__(self, payload):
        super().__init__(payload)
        self.payload = payload


class WorkspaceEscape(PermissionError):
    """A path that resolves (through ``..`` or symlinks) outside the workspace."""


class DraftEscape(PermissionError):
    """A behavior-draft path that is absolute, climbs out with ``..``, or goes
    through a symlink (a draft may hold none: publish refuses them)."""


for _cls in (HostError, NoExecutionScope, Yielded, WorkspaceEscape, DraftEscape):
    _cls.__module__ = "klbr"


# -- host requests --------------------------------------------------------------


def _rt():
    rt = _runtime
    if rt is None:
        raise NoExecutionScope(
            "klbr host requests are only available in a workbench cell (and the tasks it "
            "starts); this process has no effect scope")
    return rt


async def request(op, args=None):
    """Send a typed request to the host and return its result (a dict).
    Raises HostError when the host answers ``ok: false``."""
    if not isinstance(op, str) or not op:
        raise TypeError("op must be a non-empty string such as 'local.send'")
    if args is None:
        args = {}
    elif not isinstance(args, dict):
        raise TypeError(f"args must be a dict, not {type(args).__name__}")
    return await _rt().request(op, args)


def request_sync(op, args=None):
    """``request`` for synchronous code (a property cannot await): blocks the
    calling thread until the host answers. Raises HostError as ``request``."""
    if not isinstance(op, str) or not op:
        raise TypeError("op must be a non-empty string such as 'discord.attachment'")
    if args is None:
        args = {}
    elif not isinstance(args, dict):
        raise TypeError(f"args must be a dict, not {type(args).__name__}")
    rt = _rt()
    sync = getattr(rt, "request_sync", None)
    if sync is None:
        raise NoExecutionScope("this runtime answers host requests only to awaiting code")
    return sync(op, args)


class LocalReceipt:
    """What happened to a local send. ``status`` is ``confirmed`` (durably
    published to the operator's lane; it says nothing of whether anyone has
    read it yet) or ``held`` (not delivered; ``reason`` says why, and a resend
    of the same text is held the same way). A receipt is truthy only when
    confirmed. ``r["status"]`` reads the host's fields as well."""

    __slots__ = ("raw",)

    def __init__(self, r):
        if not isinstance(r, dict):
            raise TypeError(f"a receipt is an object, not {type(r).__name__}")
        self.raw = r

    status = property(lambda self: self.raw.get("status"))
    reason = property(lambda self: self.raw.get("reason", ""))
    event_id = property(lambda self: self.raw.get("event_id"))
    epoch = property(lambda self: self.raw.get("epoch"))

    @property
    def delivered(self):
        return self.status == "confirmed"

    def __bool__(self):
        return self.delivered

    def __getitem__(self, key):
        return self.raw[key]

    def get(self, key, default=None):
        return self.raw.get(key, default)

    def __repr__(self):
        if self.delivered:
            return f"<LocalReceipt confirmed (event {self.event_id})>"
        return f"<LocalReceipt {self.status}: {self.reason}>"


async def send(text):
    """``local.send``: deliver text to the operator's local lane and return
    a LocalReceipt. Printing is not sending."""
    if not isinstance(text, str):
        raise TypeError(f"local.send() takes a str, not {type(text).__name__}")
    return LocalReceipt(await request("local.send", {"text": text}))


def _check_seconds(seconds):
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"seconds must be None or a number, not {type(seconds).__name__}")
    if not (0 < seconds <= WAIT_MAX_SECONDS):  # also false for NaN; inf is > 600
        raise ValueError(
            f"seconds must be None or a finite number with 0 < seconds <= {WAIT_MAX_SECONDS}, "
            f"got {seconds!r}")
    return seconds


async def wait(seconds=None, reason=""):
    """``runtime.wait``: a terminal yield. The host records the wait; the cell
    ends with a ``yielded`` outcome and code after this call does not run. A
    new event or the deadline later starts a new model step.

    ``seconds``: None (until an event) or 0 < seconds <= 600.
    """
    seconds = _check_seconds(seconds)
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, not {type(reason).__name__}")
    await _rt().wait(seconds, reason)


# -- workspace --------------------------------------------------------------------

_tmp_counter = 0


def _fspath(path, what="path"):
    p = os.fspath(path)
    if not isinstance(p, str):
        raise TypeError(f"{what} must be a str (or os.PathLike of str), not {type(p).__name__}")
    if "\0" in p:
        raise ValueError(f"{what} contains a NUL character")
    return p


def _write_all(fd, data):
    view = memoryview(data)
    off = 0
    while off < len(view):
        off += os.write(fd, view[off:])


def _atomic_write(path, data):
    """Replace path's content with data: a temporary file in the same
    directory, then rename. An existing file keeps its permission bits."""
    global _tmp_counter
    d, name = os.path.split(path)
    os.makedirs(d, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    _tmp_counter += 1
    tmp = os.path.join(d, f".{name}.klbr-{os.getpid()}-{_tmp_counter}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        try:
            _write_all(fd, data)
            if mode is not None:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _kind(de):
    if de.is_symlink():
        return "symlink"
    if de.is_dir(follow_symlinks=False):
        return "dir"
    if de.is_file(follow_symlinks=False):
        return "file"
    return "other"


def _scan_sorted(d):
    try:
        with os.scandir(d) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def _walk(top):
    """Every entry under top, depth first, sorted; .git is neither listed nor
    entered and symlinked directories are not followed."""
    stack = [top]
    while stack:
        subdirs = []
        for de in _scan_sorted(stack.pop()):
            if de.name == ".git":
                continue
            yield de
            if de.is_dir(follow_symlinks=False):
                subdirs.append(de.path)
        stack.extend(reversed(subdirs))


def _prefilter(rx):
    """A MULTILINE twin of rx to skip whole files cheaply, when matching the whole
    text finds every line match (no lookaround, no \\A or \\Z); else None."""
    import re
    p = rx.pattern
    if any(s in p for s in ("(?=", "(?!", "(?<=", "(?<!", "\\A", "\\Z")):
        return None
    if rx.flags & re.MULTILINE:
        return rx
    try:
        return re.compile(p, rx.flags | re.MULTILINE)
    except re.error:
        return None


class Entry:
    """One ``ls`` entry: ``path`` (relative to the workspace), ``name``,
    ``kind`` (file, dir, symlink, other), ``size`` (files), ``abspath``."""

    __slots__ = ("path", "name", "kind", "size", "abspath")

    def __init__(self, path, name, kind, size, abspath):
        self.path, self.name, self.kind, self.size, self.abspath = path, name, kind, size, abspath

    def __repr__(self):
        if self.kind == "file":
            return f"Entry({self.path!r}, file, {self.size} bytes)"
        return f"Entry({self.path!r}, {self.kind})"

    def __str__(self):
        return self.path

    def __fspath__(self):
        return self.abspath

    def __eq__(self, other):
        return isinstance(other, Entry) and self.abspath == other.abspath and self.kind == other.kind

    def __hash__(self):
        return hash(self.abspath)


class Match(tuple):
    """One ``search`` hit, a (path, line, text) tuple: ``path`` relative to the
    workspace, 1-based ``line`` number, the line's ``text`` (cut at 1000
    characters)."""

    __slots__ = ()
    TEXT_LIMIT = 1000

    def __new__(cls, path, line, text):
        return tuple.__new__(cls, (path, line, text))

    path = property(lambda self: self[0])
    line = property(lambda self: self[1])
    text = property(lambda self: self[2])

    def __repr__(self):
        return f"Match({self[0]!r}, {self[1]}, {self[2]!r})"

    def __str__(self):
        return f"{self[0]}:{self[1]}: {self[2]}"


class SearchResult:
    """``matches`` (list of Match) and ``truncated``: True when max_results cut
    the search short, so a capped result never reads as a complete one."""

    __slots__ = ("pattern", "matches", "truncated")

    def __init__(self, pattern, matches, truncated):
        self.pattern, self.matches, self.truncated = pattern, matches, truncated

    def __iter__(self):
        return iter(self.matches)

    def __len__(self):
        return len(self.matches)

    def __getitem__(self, i):
        return self.matches[i]

    def __str__(self):
        lines = [str(m) for m in self.matches]
        if self.truncated:
            lines.append(f"[truncated: stopped at {len(self.matches)} matches; "
                         "narrow the pattern or path, or raise max_results]")
        elif not self.matches:
            lines.append("(no matches)")
        return "\n".join(lines)

    def __repr__(self):
        head = f"<SearchResult {self.pattern!r}: {len(self.matches)} matches"
        return head + (", truncated>" if self.truncated else ">") + "\n" + str(self)


class RunResult:
    """The result of ``run``: ``exit_code`` (None if the process did not exit
    normally), ``stdout``/``stderr`` (bytes), ``truncated`` (output was cut by
    the host's cap), ``timed_out``; ``raw`` is the host's reply."""

    __slots__ = ("exit_code", "stdout", "stderr", "truncated", "timed_out", "raw")
    PREVIEW = 2000

    def __init__(self, exit_code, stdout, stderr, truncated, timed_out, raw=None):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr
        self.truncated, self.timed_out, self.raw = truncated, timed_out, raw

    @classmethod
    def from_reply(cls, r):
        import binascii
        if not isinstance(r, dict):
            raise TypeError(f"workspace.run reply is {type(r).__name__}, not an object")

        def b64(name):
            s = r.get(name) or ""
            try:
                return binascii.a2b_base64(s, strict_mode=True)
            except (binascii.Error, ValueError, TypeError) as e:
                raise ValueError(f"workspace.run reply: {name} is not base64: {e}") from None

        return cls(r.get("exit_code"), b64("stdout_b64"), b64("stderr_b64"),
                   bool(r.get("truncated")), bool(r.get("timed_out")), r)

    @property
    def ok(self):
        return self.exit_code == 0 and not self.timed_out

    def __repr__(self):
        out = [f"RunResult(exit_code={self.exit_code!r}, timed_out={self.timed_out}, truncated={self.truncated})"]
        for name in ("stdout", "stderr"):
            b = getattr(self, name)
            if b:
                text = b[:self.PREVIEW].decode("utf-8", "replace")
                more = f" (first {self.PREVIEW})" if len(b) > self.PREVIEW else ""
                out.append(f"--- {name}: {len(b)} bytes{more} ---\n{text}")
        return "\n".join(out)


class WorkspaceFile:
    """A file in the workspace, from ``open_file``. ``read()`` reads it (UTF-8,
    newlines kept as they are), ``text`` is the last content read or written,
    ``await write(text)`` replaces it atomically, ``await replace(old, new)``
    edits exactly one occurrence."""

    __slots__ = ("workspace", "path", "abspath", "_text")

    def __init__(self, workspace, abspath):
        self.workspace = workspace
        self.abspath = abspath
        self.path = workspace.relpath(abspath)
        self._text = None

    def __repr__(self):
        return f"<WorkspaceFile {self.path!r}>"

    def __fspath__(self):
        return self.abspath

    def _check(self):
        # The path must still resolve to itself (no symlink swapped in since open).
        real = self.workspace.resolve(self.abspath)
        if real != self.abspath:
            raise WorkspaceEscape(f"{self.path!r} now resolves to {real!r}; open it again")
        return real

    @property
    def exists(self):
        return os.path.isfile(self.abspath)

    def read(self):
        with open(self._check(), "r", encoding="utf-8", newline="") as f:
            self._text = f.read()
        return self._text

    @property
    def text(self):
        return self.read() if self._text is None else self._text

    async def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() takes a str, not {type(text).__name__}")
        _atomic_write(self._check(), text.encode("utf-8"))
        self._text = text

    async def replace(self, old, new):
        if not isinstance(old, str) or not isinstance(new, str):
            raise TypeError("replace() takes two str")
        if not old:
            raise ValueError("replace(): the old text is empty")
        text = self.read()
        n = text.count(old)
        if n != 1:
            raise ValueError(
                f"{self.path}: replace() needs exactly one occurrence of the old text, found {n}")
        await self.write(text.replace(old, new, 1))


class Workspace:
    """File helpers bound to one root directory. Every path is relative to the
    root (absolute paths must lie inside it); a path that resolves outside the
    root, through ``..`` or a symlink, raises WorkspaceEscape."""

    def __init__(self, root):
        root = os.path.realpath(_fspath(root, "root"))
        if not os.path.isdir(root):
            raise NotADirectoryError(f"workspace root {root!r} is not a directory")
        self.root = root
        self._prefix = root if root.endswith(os.sep) else root + os.sep

    def __repr__(self):
        return f"Workspace({self.root!r})"

    def contains(self, real):
        return real == self.root or real.startswith(self._prefix)

    def resolve(self, path="."):
        """The real absolute path of ``path``, checked to lie in the workspace."""
        p = _fspath(path)
        real = os.path.realpath(os.path.join(self.root, p))
        if not self.contains(real):
            raise WorkspaceEscape(f"{p!r} resolves to {real!r}, outside the workspace {self.root!r}")
        return real

    def relpath(self, real):
        return "." if real == self.root else real[len(self._prefix):]

    async def open_file(self, path):
        real = self.resolve(path)
        if os.path.isdir(real):
            raise IsADirectoryError(f"{self.relpath(real)!r} is a directory")
        f = WorkspaceFile(self, real)
        if os.path.exists(real):
            f.read()
        return f

    def _entry(self, de):
        kind = _kind(de)
        size = None
        if kind == "file":
            try:
                size = de.stat(follow_symlinks=False).st_size
            except OSError:
                pass
        return Entry(self.relpath(de.path), de.name, kind, size, de.path)

    async def ls(self, path=".", recursive=False, match=None):
        """Entries of a directory (one level), or with ``recursive=True`` every
        entry below it (.git skipped, symlinked directories not followed);
        ``match`` filters by an fnmatch glob on the entry name. Sorted by path."""
        if match is not None and not isinstance(match, str):
            raise TypeError("match must be a glob string such as '*.py'")
        base = self.resolve(path)
        if not os.path.isdir(base):
            os.stat(base)  # FileNotFoundError for a missing path
            name = os.path.basename(base)
            if match is not None and not _fnmatch(name, match):
                return []
            return [Entry(self.relpath(base), name, "file", os.path.getsize(base), base)]
        entries = _walk(base) if recursive else _scan_sorted(base)
        out = [self._entry(de) for de in entries if match is None or _fnmatch(de.name, match)]
        out.sort(key=lambda e: e.path)
        return out

    async def search(self, pattern, path=".", max_results=100):
        """Regex search over the text files under ``path`` (binary files, meaning
        a NUL byte in the first 8 KiB, and .git are skipped). Returns a
        SearchResult whose ``truncated`` says whether max_results cut it short."""
        import re
        if isinstance(pattern, re.Pattern):
            rx = pattern
        elif isinstance(pattern, str):
            rx = re.compile(pattern)
        else:
            raise TypeError("pattern must be a str or a compiled str pattern")
        if not isinstance(rx.pattern, str):
            raise TypeError("pattern must be a str pattern, not bytes")
        if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1:
            raise ValueError(f"max_results must be an int >= 1, got {max_results!r}")
        base = self.resolve(path)
        pre = _prefilter(rx)
        search = rx.search
        limit = Match.TEXT_LIMIT
        matches = []
        truncated = False
        for abspath in self._text_files(base):
            try:
                with open(abspath, "rb") as f:
                    head = f.read(8192)
                    if b"\0" in head:
                        continue
                    data = head + f.read()
            except OSError:
                continue
            text = data.decode("utf-8", "replace")
            if "\r" in text:
                text = text.replace("\r\n", "\n")
            if pre is not None and pre.search(text) is None:
                continue
            lines = text.split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            rel = self.relpath(abspath)
            for i, line in enumerate(lines, 1):
                if search(line):
                    if len(matches) == max_results:
                        truncated = True
                        break
                    matches.append(Match(rel, i, line if len(line) <= limit else line[:limit] + "…"))
            if truncated:
                break
        return SearchResult(rx.pattern, matches, truncated)

    def _text_files(self, base):
        if not os.path.isdir(base):
            os.stat(base)  # FileNotFoundError for a missing path
            yield base
            return
        for de in _walk(base):
            if de.is_file(follow_symlinks=False):
                yield de.path
            elif de.is_symlink():
                real = os.path.realpath(de.path)
                if self.contains(real) and os.path.isfile(real):
                    yield de.path

    async def delete(self, path, recursive=False):
        """Delete a file or symlink (the link, not its target), an empty
        directory, or with ``recursive=True`` a directory tree."""
        p = _fspath(path)
        joined = os.path.join(self.root, p).rstrip(os.sep) or os.sep
        parent, name = os.path.split(joined)
        if name in ("", ".", ".."):
            target = self.resolve(p)
        else:
            parent_real = os.path.realpath(parent)
            if not self.contains(parent_real):
                raise WorkspaceEscape(f"{p!r} lies in {parent_real!r}, outside the workspace {self.root!r}")
            target = os.path.join(parent_real, name)
        if target == self.root:
            raise PermissionError("refusing to delete the workspace root")
        st = os.lstat(target)
        if (st.st_mode & 0o170000) == 0o040000:  # a directory, not a link to one
            if recursive:
                import shutil
                shutil.rmtree(target)
            else:
                try:
                    os.rmdir(target)
                except OSError as e:
                    if os.listdir(target):
                        raise OSError(e.errno, f"{self.relpath(target)!r} is a non-empty directory; "
                                               "pass recursive=True to delete it") from None
                    raise

        else:
            os.unlink(target)

    async def run(self, argv, cwd=None, env=None, timeout=60):
        """Run a command through the host (``workspace.run``): no shell, the
        host owns the process group, the output cap, the timeout and cleanup."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv is a list of strings (there is no shell), not a string")
        argv = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv]
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError("argv must be a non-empty list of strings")
        if cwd is None:
            rel = "."
        else:
            real = self.resolve(cwd)
            if not os.path.isdir(real):
                raise NotADirectoryError(f"cwd {self.relpath(real)!r} is not a directory")
            rel = self.relpath(real)
        if env is None:
            env = {}
        elif not isinstance(env, dict) or not all(
                isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env.items()):
            raise TypeError("env must be a dict of str names (without '=') to str values")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
        if not (0 < timeout < float("inf")):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        reply = await request("workspace.run", {"argv": argv, "cwd": rel, "env": dict(env), "timeout": timeout})
        return RunResult.from_reply(reply)


def _fnmatch(name, pattern):
    import fnmatch
    return fnmatch.fnmatchcase(name, pattern)


_default_workspace = None


def default_workspace():
    """The session's workspace: ``KLBR_WORKSPACE`` (else the current
    directory), resolved once per process."""
    global _default_workspace
    if _default_workspace is None:
        _default_workspace = Workspace(os.environ.get("KLBR_WORKSPACE") or os.getcwd())
    return _default_workspace


async def current():
    """The Workspace object the prelude helpers act on."""
    return default_workspace()


async def open_file(path):
    """Open a workspace file (it need not exist yet): an object with ``read()``,
    ``text``, ``await write(text)`` and ``await replace(old, new)``."""
    return await default_workspace().open_file(path)


async def ls(path=".", recursive=False, match=None):
    """List a directory (one level), or recursively with an optional name glob."""
    return await default_workspace().ls(path, recursive, match)


async def search(pattern, path=".", max_results=100):
    """Regex search over workspace text files; ``.truncated`` when capped."""
    return await default_workspace().search(pattern, path, max_results)


async def delete(path, recursive=False):
    """Delete a workspace file, symlink or (``recursive=True``) directory."""
    return await default_workspace().delete(path, recursive)


async def run(argv, cwd=None, env=None, timeout=60):
    """Run argv in the workspace through the host; returns a RunResult."""
    return await default_workspace().run(argv, cwd, env, timeout)
