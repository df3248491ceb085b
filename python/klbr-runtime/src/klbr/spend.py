"""``klbr.spend``: what your model requests cost, and the caps that bound it.

Read-only: the same view as the operator's ``klbr-core spend``. A cell
cannot raise a cap or write the ledger.

- ``s = await spend.summary(by="day", since=None)``: the ledger, in total
  and grouped ``by`` one of ``day`` (a calendar day in the caps' time zone),
  ``route``, ``session``, ``tree`` or ``purpose`` (turn, summary, test).
  ``since`` is a ``datetime`` (naive: local time), a ``date``, a
  ``timedelta`` (that long ago) or an RFC 3339 string; ``None``: all of it.
  ``s.total`` and each of ``s.groups`` have ``.key``, ``.usd``,
  ``.requests``, ``.tokens``, ``.prompt_tokens``, ``.cache_read_tokens`` and
  ``.unpriced_requests`` (requests of a route without a price: counted in
  tokens only). ``s.state`` (a dict, or ``None``) is today's and this
  month's spend against the caps (``day_usd``, ``daily_usd_cap``,
  ``month_usd``, ``monthly_usd_cap``, ``day_resets``...) and the sessions
  ``held`` at one.
"""

import datetime as _dt

from ._sdk import request

__all__ = ["summary", "Summary", "Total", "GROUPS"]

GROUPS = ("day", "route", "session", "tree", "purpose")


class Total:
    """The ledger's sum over a period, or over one group of it."""

    __slots__ = ("key", "usd", "requests", "tokens", "prompt_tokens", "cache_read_tokens", "unpriced_requests")

    def __init__(self, r):
        self.key = r.get("key", "")
        self.usd = float(r.get("usd", 0))
        self.requests = int(r.get("requests", 0))
        self.tokens = int(r.get("tokens", 0))
        self.prompt_tokens = int(r.get("prompt_tokens", 0))
        self.cache_read_tokens = int(r.get("cache_read_tokens", 0))
        self.unpriced_requests = int(r.get("unpriced_requests", 0))

    def __repr__(self):
        key = f"{self.key}: " if self.key else ""
        unpriced = f", {self.unpriced_requests} unpriced" if self.unpriced_requests else ""
        return f"<{key}${self.usd:.4f}, {self.requests} requests, {self.tokens} tokens{unpriced}>"


class Summary:
    """``total``, ``groups`` (iterate, ``len()`` or index it), ``by``,
    ``since`` and ``state``."""

    def __init__(self, r):
        self.by, self.since = r.get("by"), r.get("since")
        self.total = Total(r.get("total") or {})
        self.groups = [Total(g) for g in r.get("groups") or []]
        self.state = r.get("state")

    def __iter__(self):
        return iter(self.groups)

    def __len__(self):
        return len(self.groups)

    def __getitem__(self, i):
        return self.groups[i]

    def __repr__(self):
        lines = "\n".join(repr(g) for g in self.groups)
        return f"<spend by {self.by}: {self.total!r}>" + ("\n" + lines if lines else "")


def _since(since):
    if since is None:
        return ""
    if isinstance(since, str):
        return since
    if isinstance(since, _dt.timedelta):
        since = _dt.datetime.now(_dt.timezone.utc) - since
    elif isinstance(since, _dt.date) and not isinstance(since, _dt.datetime):
        since = _dt.datetime(since.year, since.month, since.day).astimezone()
    if isinstance(since, _dt.datetime):
        if since.tzinfo is None:
            since = since.astimezone()
        return since.isoformat(timespec="seconds")
    raise TypeError("spend.summary: since is a datetime, date, timedelta, RFC 3339 string or None")


async def summary(by="day", since=None):
    if by not in GROUPS:
        raise ValueError(f"spend.summary: by is one of {', '.join(GROUPS)}")
    args = {"by": by}
    s = _since(since)
    if s:
        args["since"] = s
    return Summary(await request("spend.summary", args))
