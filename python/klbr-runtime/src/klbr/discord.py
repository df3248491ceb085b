"""``klbr.discord``: take part in Discord through the host's outbox.

- ``discord.current()``: the one Discord conversation of this cell's
  attention frame (HostError ``ambiguous`` or ``no_conversation`` otherwise).
  Use it directly (the host is asked at its first use) or await it.
- ``await discord.conversations()``: every known conversation (aliases d1, d2, ...).
- ``discord.conversation("d2")``: a handle by alias, for proactive messages.
- ``await conversation.history(limit=20, before=None, after=None)``: a bounded
  backread. Reading is not accepting work: nothing becomes an input or item.
- ``await conversation.send(text, reply_to=None, item=None, files=None)``:
  returns a Receipt (``source_item=`` is another name for ``item=``);
  ``files`` are workspace paths (at most 10, 10 MiB).
  Only ``receipt.delivered`` (state ``confirmed``) means it was said;
  ``pending``/``attempting``/``unknown`` are not delivery, ``failed`` is not.
- ``await conversation.react(message_id, emoji)``: a reaction (Receipt). It
  does not mark anything acted: combine it with ``mark`` when you mean to.
- ``await discord.items()`` / ``await conversation.items()``: DMs and
  mentions still waiting for a decision (pending or seen), newest first.
- ``await discord.mark(item_id, status, note="")``: record a decision on a DM
  or mention: ``seen``, ``acted``, ``ignored``, or ``pending`` to reopen.
- ``item.attachments``: the message's attachments (``Attachment``: ``alias``
  a1, a2, ... within the message, ``filename``, ``content_type``, ``size``,
  ``state``); ``await a.read()`` is its bytes, ``a.text`` its text (text
  types), ``a.path`` a read-only copy to open.
"""

import base64
import os
import re
import tempfile

from . import _outside
from ._sdk import HostError, request, request_sync

__all__ = ["current", "conversations", "conversation", "items", "mark", "receipt",
           "Conversation", "Receipt", "SentFile", "Message", "Item", "Attachment", "HostError", "STATUSES"]

STATUSES = ("pending", "seen", "acted", "ignored")

MAX_FILES = 10                    # files a send carries (Discord's limit; 10 MiB together)
TEXT_MAX_BYTES = 1 << 20          # a.text: larger text is read()
ATTACHMENT_MAX_BYTES = 500 << 20  # the most [discord] attachment_max_bytes allows
_CACHE_BYTES = 32 << 20           # bytes kept on the object after a read
_TEXT_TYPES = frozenset({
    "application/json", "application/xml", "application/yaml", "application/x-yaml", "application/toml",
    "application/javascript", "application/x-javascript", "application/x-sh", "application/x-ndjson",
    "application/sql", "application/x-python", "application/x-httpd-php", "application/csv"})
_TEXT_SUFFIXES = frozenset(
    ".txt .log .md .rst .json .jsonl .ndjson .csv .tsv .py .go .rs .c .h .cc .cpp .hpp .java .kt .js .ts .tsx .jsx "
    ".rb .php .pl .sh .bash .zsh .fish .toml .yaml .yml .xml .html .htm .css .scss .ini .cfg .conf .env .sql "
    ".diff .patch .tex .nix .lua .swift .cs .hs .ml .ex .exs .erl .clj .scala .r .dockerfile .gitignore".split())


class Receipt:
    """What happened to a send or reaction. ``delivered`` is True only when
    Discord confirmed it (``state == "confirmed"``); a receipt is truthy only
    then. ``state`` is one of pending, attempting, confirmed, failed, unknown,
    or held: delivery.review did not allow it, and it waits for the operator
    (``klbr-core release`` sends it, ``klbr-core drop`` refuses it; you learn
    of either as a notice, and ``await r.refresh()`` shows it).
    A send that delivery.prepare split into several messages has one receipt
    per message in ``parts`` (this one is the first's); it is delivered only
    when every part is. ``files`` lists the files a send carried (a
    ``SentFile`` each: ``filename``, ``size`` and ``attachment_id``, Discord's
    id of the file once it confirmed the message, else None)."""

    __slots__ = ("effect_id", "kind", "state", "conversation", "message_id", "reply_reference",
                 "item_id", "error_code", "error", "repeat", "note", "parts", "files", "raw")

    def __init__(self, r):
        if not isinstance(r, dict):
            raise TypeError(f"a receipt is an object, not {type(r).__name__}")
        self.raw = r
        self.effect_id = r.get("effect_id")
        self.kind = r.get("kind", "send")
        self.state = r.get("state", "unknown")
        self.conversation = r.get("conversation")
        self.message_id = r.get("message_id") or None
        self.reply_reference = bool(r.get("reply_reference"))
        self.item_id = r.get("item_id") or None
        self.error_code = r.get("error_code") or None
        self.error = r.get("error") or None
        self.repeat = bool(r.get("repeat"))
        self.note = r.get("note") or None
        parts = r.get("parts")
        self.parts = [Receipt(p) for p in parts] if isinstance(parts, list) else []
        files = r.get("files")
        self.files = [SentFile(f) for f in files if isinstance(f, dict)] if isinstance(files, list) else []

    @property
    def delivered(self):
        if self.parts:
            return all(p.state == "confirmed" for p in self.parts)
        return self.state == "confirmed"

    def __bool__(self):
        return self.delivered

    async def refresh(self):
        """Ask the host for this effect's current state (a pending receipt may
        have settled since)."""
        return Receipt(await request("discord.receipt", {"effect_id": self.effect_id}))

    def __repr__(self):
        head = f"<Receipt {self.kind} #{self.effect_id} in {self.conversation}: {self.state}"
        if self.state == "confirmed":
            tail = f", message {self.message_id}" if self.message_id else ""
            return head + tail + (" (a reply)" if self.reply_reference else "") + ">"
        why = f" ({self.error_code}: {self.error})" if self.error_code else ""
        if self.state in ("pending", "attempting"):
            note = f" ({self.note})" if self.note else ""
            return head + why + " - not delivered yet; await receipt.refresh() later" + note + ">"
        if self.state == "unknown":
            return head + why + " - delivery could not be established; do not claim it was said>"
        return head + why + " - NOT delivered>"


class SentFile:
    """A file a send carried, as its receipt names it."""

    __slots__ = ("filename", "size", "attachment_id")

    def __init__(self, f):
        self.filename = f.get("filename", "")
        self.size = f.get("size", 0)
        self.attachment_id = f.get("attachment_id") or None

    def __repr__(self):
        where = f", attachment {self.attachment_id}" if self.attachment_id else ", not confirmed by Discord"
        return f"<SentFile {self.filename!r}, {self.size} bytes{where}>"


class Message:
    """One message of a backread: ``id``, ``author_id``, ``author``, ``bot``,
    ``content``, ``reply_to``, ``at`` (ISO 8601 text)."""

    __slots__ = ("id", "author_id", "author", "bot", "content", "reply_to", "at")

    def __init__(self, m):
        self.id = m.get("message_id")
        self.author_id = m.get("author_id")
        self.author = m.get("author_name") or self.author_id
        self.bot = bool(m.get("bot"))
        self.content = m.get("content", "")
        self.reply_to = m.get("reply_to") or None
        self.at = m.get("occurred_at")

    def __repr__(self):
        text = self.content if len(self.content) <= 80 else self.content[:80] + "…"
        return f"<Message {self.id} {_outside.name(self.author)}: {text!r}>"


class Attachment:
    """A Discord attachment of a message this agent was shown: ``alias`` (a1,
    a2, ... in its message), ``id``, ``message_id``, ``filename`` (from
    outside: the sender chose it), ``content_type`` (None when Discord did not
    say), ``size`` in bytes, and ``state`` of the fetch of its bytes
    (``pending``, ``fetched``, or ``failed`` with ``error``).

    - ``await a.read()``: its bytes (the host waits a while for a fetch still
      under way; a failed fetch raises HostError ``unavailable`` saying why).
    - ``a.text``: its text, for text types (``text/*``, JSON, XML, YAML, ...;
      by file name when Discord gave no type) of at most 1 MiB, decoded as
      UTF-8; otherwise ValueError saying why (use ``read()`` for bytes).
    - ``a.path``: a read-only copy in this cell's temporary directory, for
      tools that want a file name.
    """

    __slots__ = ("alias", "id", "message_id", "filename", "content_type", "size", "state", "sha256", "error",
                 "_data", "_path")

    def __init__(self, a, message_id=None):
        self.alias = a.get("alias")
        self.id = a.get("id")
        self.message_id = message_id or a.get("message_id")
        self.filename = a.get("filename") or ""
        self.content_type = a.get("content_type") or None
        self.size = a.get("size") or 0
        self.state = a.get("state") or "pending"
        self.sha256 = a.get("sha256") or None
        self.error = a.get("error") or None
        self._data = None
        self._path = None

    def _args(self, offset):
        if not self.message_id or not self.id:
            raise HostError("invalid", f"attachment {self.alias}: its message is not known; "
                                       "take attachments from an item (discord.items())")
        return {"message_id": str(self.message_id), "attachment_id": str(self.id), "offset": offset}

    def _take(self):
        """A chunked read: yields the next request's arguments, is sent each
        answer, and returns the bytes."""
        chunks, offset = [], 0
        while True:
            r = yield self._args(offset)
            data = base64.b64decode(r.get("data") or "")
            if r.get("offset") != offset or (not data and not r.get("eof")):
                raise HostError("failed", f"attachment {self.alias}: the host answered a chunk out of order")
            chunks.append(data)
            offset += len(data)
            if offset > ATTACHMENT_MAX_BYTES:
                raise HostError("too_large", f"attachment {self.alias} is larger than {ATTACHMENT_MAX_BYTES} bytes")
            if r.get("eof"):
                self.sha256 = r.get("sha256") or self.sha256
                self.state = "fetched"
                return b"".join(chunks)

    def _finish(self, data):
        if len(data) <= _CACHE_BYTES:
            self._data = data
        return data

    async def read(self):
        """The attachment's bytes."""
        if self._data is not None:
            return self._data
        gen = self._take()
        args = next(gen)
        while True:
            r = await request("discord.attachment", args)
            try:
                args = gen.send(r)
            except StopIteration as done:
                return self._finish(done.value)

    def _read_sync(self):
        if self._data is not None:
            return self._data
        gen = self._take()
        args = next(gen)
        while True:
            r = request_sync("discord.attachment", args)
            try:
                args = gen.send(r)
            except StopIteration as done:
                return self._finish(done.value)

    def is_text(self):
        """Whether this attachment's type (or, without one, its file name) is text."""
        ct = (self.content_type or "").split(";", 1)[0].strip().lower()
        if ct:
            return ct.startswith("text/") or ct in _TEXT_TYPES or ct.endswith(("+json", "+xml", "+yaml"))
        return os.path.splitext(self.filename.lower())[1] in _TEXT_SUFFIXES

    @property
    def text(self):
        """The attachment's text (UTF-8), for text types of at most 1 MiB."""
        what = f"attachment {self.alias} ({self.filename!r}, {self.content_type or 'no type'})"
        if not self.is_text():
            raise ValueError(f"{what} is not a text type; use `await a.read()` for its bytes")
        if self.size > TEXT_MAX_BYTES:
            raise ValueError(f"{what} has {self.size} bytes, more than a.text's {TEXT_MAX_BYTES}; "
                             "use `await a.read()` (or a.path) and decode what you need")
        data = self._read_sync()
        if len(data) > TEXT_MAX_BYTES:
            raise ValueError(f"{what} has {len(data)} bytes, more than a.text's {TEXT_MAX_BYTES}; use `await a.read()`")
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ValueError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start}); "
                             "use `await a.read()` and decode it yourself") from None

    @property
    def path(self):
        """A read-only copy of the attachment in this cell's temporary directory."""
        if self._path is not None and os.path.exists(self._path):
            return self._path
        data = self._read_sync()
        d = os.path.join(tempfile.gettempdir(), f"klbr-attachments-{os.getpid()}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", self.filename)[-100:].lstrip(".") or "attachment"
        p = os.path.join(d, f"{self.message_id}-{self.alias}-{safe}")
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o444)
            os.replace(tmp, p)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._path = p
        return p

    def __repr__(self):
        state = "" if self.state == "fetched" else f" ({self.state}{': ' + self.error if self.error else ''})"
        return f"<Attachment {self.alias} {self.filename!r} {self.content_type or 'unknown type'} {self.size} B{state}>"


class Item:
    """An attention item (a DM or mention) and the decision on it;
    ``attachments`` are its message's (``Attachment``)."""

    __slots__ = ("id", "conversation", "message_id", "status", "decision_origin", "note", "attachments", "raw")

    def __init__(self, it):
        self.raw = it
        self.id = it.get("id")
        self.conversation = it.get("conversation")
        self.message_id = it.get("message_id")
        self.status = it.get("status")
        self.decision_origin = it.get("decision_origin") or None
        self.note = it.get("note") or ""
        atts = it.get("attachments")
        self.attachments = [Attachment(a, self.message_id) for a in atts if isinstance(a, dict)] if isinstance(atts, list) else []

    def __repr__(self):
        by = f" by {self.decision_origin}" if self.decision_origin else ""
        return f"<Item {self.id} in {self.conversation}: {self.status}{by}>"


def _check_id(name, v, optional=False):
    if v is None and optional:
        return None
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        v = str(v)
    if not isinstance(v, str) or not v.isdigit() or len(v) > 32:
        raise ValueError(f"{name} must be a Discord id (digits), got {v!r}")
    return v


class Conversation:
    """A Discord channel, thread or DM, by its durable alias (d1, d2, ...).
    An alias is a display name; the host maps it to the channel id."""

    __slots__ = ("alias", "key", "kind", "guild_id", "channel_id", "name", "pending")

    def __init__(self, c):
        if isinstance(c, str):
            c = {"alias": c}
        self.alias = c.get("alias")
        self.key = c.get("key")
        self.kind = c.get("kind")
        self.guild_id = c.get("guild_id") or None
        self.channel_id = c.get("channel_id")
        self.name = c.get("name") or None
        self.pending = c.get("pending")

    def __repr__(self):
        parts = [self.alias or "?"]
        if self.kind:
            parts.append(self.kind)
        if self.name:
            parts.append("#" + _outside.name(self.name))
        if self.pending:
            parts.append(f"{self.pending} pending")
        return "<Conversation " + " ".join(parts) + ">"

    def __eq__(self, other):
        return isinstance(other, Conversation) and self.alias == other.alias

    def __hash__(self):
        return hash(self.alias)

    async def history(self, limit=20, before=None, after=None):
        """Up to ``limit`` (1-100) messages, newest first, before/after a
        message id. Not stored; not inputs; not attention items."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            raise ValueError(f"limit must be an int in 1..100, got {limit!r}")
        args = {"conversation": self.alias, "limit": limit}
        if before is not None:
            args["before"] = _check_id("before", before)
        if after is not None:
            args["after"] = _check_id("after", after)
        r = await request("discord.history", args)
        return [Message(m) for m in r.get("messages", [])]

    async def send(self, text, reply_to=None, item=None, files=None, source_item=None):
        """Say ``text`` here. Returns a Receipt: check ``receipt.delivered``.
        ``reply_to`` forces a reply to that message; ``item`` (or its other
        name, ``source_item``) names the attention item this answers (it must
        be in this conversation; omitted, the host infers it only from this
        cell's own frame). ``files`` are paths of files in the workspace, or
        Attachments of items (passed on), at most 10 and 10 MiB together, as
        Discord takes them from a bot; they go with the message. The host
        copies workspace files when you send (links are not followed), so
        later changes do not matter."""
        if not isinstance(text, str) or not text:
            raise TypeError("send() takes a non-empty str")
        if source_item is not None:
            if item is not None and _item_id(item) != _item_id(source_item):
                raise TypeError("send() got item= and source_item= naming different items; "
                                "they are one argument: pass item= only")
            item = source_item
        args = {"conversation": self.alias, "text": text}
        if reply_to is not None:
            args["reply_to"] = _check_id("reply_to", getattr(reply_to, "id", reply_to))
        if item is not None:
            args["item_id"] = _item_id(item)
        if files is not None:
            if isinstance(files, (str, bytes, os.PathLike, Attachment)):
                files = [files]
            paths = [{"message_id": str(f.message_id), "attachment_id": str(f.id)} if isinstance(f, Attachment)
                     else os.path.abspath(os.fsdecode(os.fspath(f))) for f in files]
            if len(paths) > MAX_FILES:
                raise ValueError(f"{len(paths)} files; Discord takes at most {MAX_FILES} a message")
            if paths:
                args["files"] = paths
        return Receipt(await request("discord.send", args))

    async def items(self, status=("pending", "seen"), limit=50):
        """This conversation's attention items in ``status``, newest first."""
        return await items(status=status, limit=limit, conversation=self.alias)

    async def react(self, message_id, emoji):
        """Add a reaction: a Unicode emoji, or ``name:id`` of a custom one."""
        if not isinstance(emoji, str) or not emoji:
            raise TypeError("emoji must be a non-empty str")
        mid = _check_id("message_id", getattr(message_id, "id", message_id))
        return Receipt(await request("discord.react", {"conversation": self.alias, "message_id": mid, "emoji": emoji}))


def _item_id(item):
    v = getattr(item, "id", item)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"an item is an Item or a positive int id, got {item!r}")
    return v


class _Current(Conversation):
    """``discord.current()``: the one conversation of this cell's attention
    frame, asked of the host once, at the first use or ``await``."""

    __slots__ = ("_asked",)

    def __init__(self):
        super().__init__({})
        self._asked = False

    async def _ask(self):
        if not self._asked:
            Conversation.__init__(self, await request("discord.current", {}))
            self._asked = True
        return self

    def __await__(self):
        return self._ask().__await__()

    def __repr__(self):
        if not self._asked:
            return "<Conversation current (the host is asked at the first use)>"
        return super().__repr__()

    async def history(self, limit=20, before=None, after=None):
        await self._ask()
        return await super().history(limit=limit, before=before, after=after)

    async def send(self, text, reply_to=None, item=None, files=None, source_item=None):
        await self._ask()
        return await super().send(text, reply_to=reply_to, item=item, files=files, source_item=source_item)

    async def items(self, status=("pending", "seen"), limit=50):
        await self._ask()
        return await super().items(status=status, limit=limit)

    async def react(self, message_id, emoji):
        await self._ask()
        return await super().react(message_id, emoji)


def current():
    """The one Discord conversation of this cell's attention frame: use it
    as it is (``c = discord.current(); await c.send(...)``) or await it
    (``c = await discord.current()``). The host is asked once, at the first
    use; it raises HostError (``ambiguous``, ``no_conversation``) rather
    than guess."""
    return _Current()


async def conversations():
    """Every known conversation, by alias."""
    r = await request("discord.conversations", {})
    return [Conversation(c) for c in r.get("conversations", [])]


def conversation(alias):
    """A handle on a conversation by alias (``"d2"``) or key
    (``"discord:<channel id>"``); the host checks it when used."""
    if not isinstance(alias, str) or not alias:
        raise TypeError("conversation() takes an alias such as 'd2'")
    return Conversation(alias)


async def items(status=("pending", "seen"), limit=50, conversation=None):
    """Attention items (DMs and mentions) in ``status`` (a str or a tuple of
    them), newest first; all conversations unless one is named."""
    if isinstance(status, str):
        status = (status,)
    status = tuple(status)
    for s in status:
        if s not in STATUSES:
            raise ValueError(f"status must be among {', '.join(STATUSES)}, got {s!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 500:
        raise ValueError(f"limit must be an int in 1..500, got {limit!r}")
    args = {"statuses": list(status), "limit": limit}
    if conversation is not None:
        args["conversation"] = getattr(conversation, "alias", conversation)
    r = await request("discord.items", args)
    return [Item(it) for it in r.get("items", [])]


async def mark(item_id, status, note=""):
    """Record a decision on an attention item: ``seen``, ``acted``,
    ``ignored``, or ``pending`` (an explicit reopen of an acted or ignored
    item). Returns the Item as recorded."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    if not isinstance(note, str):
        raise TypeError("note must be a str")
    r = await request("discord.mark", {"item_id": _item_id(item_id), "status": status, "note": note})
    return Item(r["item"])


async def receipt(effect_id):
    """The current receipt of an effect by id."""
    return Receipt(await request("discord.receipt", {"effect_id": _item_id(effect_id)}))
