"""History policy: ``compaction.plan`` and ``summary.prepare``.

``compaction.plan`` is asked when the next request would pass the
compaction threshold. Input::

    {"reason": "threshold" | "budget" | "operator",
     "need": int, "threshold": int, "budget": int,   # estimated tokens
     "compact_at": float,                            # agent.compact_at
     "candidates": [{"index": int, "entries": int, "units": int, "tokens": int,
                     "summaries": int, "first_at": float, "last_at": float}, ...]}

Candidates are eligible runs, oldest first. Output::

    {"choose": index | None,       # None: not now (refused over the hard budget)
     "compact_at": float (optional), # compact earlier from now on, 0.1..compact_at
     "reason": str}

The host validates the answer; a failing or nonsensical hook gets the host's
default (the oldest candidate). It cannot stop the host from compacting a
request that does not fit, nor raise the summarizer's retry limit.

``summary.prepare`` may adjust the summary prompt (prompts/summary.md) before
each summary request. Input: ``{"prompt", "source_bytes", "entries",
"depth"}``; output: ``{"prompt": str}``.
"""


def plan(data):
    """The oldest eligible run: summaries stay chronological."""
    if not isinstance(data, dict) or not isinstance(data.get("candidates"), list):
        raise ValueError("compaction.plan: input must have a candidates list")
    if not data["candidates"]:
        return {"choose": None, "reason": "nothing eligible"}
    return {"choose": 0, "reason": "the oldest eligible run"}


def prepare(data):
    """The release's prompt as it is; deeper summaries (summaries of
    summaries) are asked to keep the refs they cite."""
    if not isinstance(data, dict) or not isinstance(data.get("prompt"), str) or not data["prompt"]:
        raise ValueError("summary.prepare: input must have a prompt")
    prompt = data["prompt"]
    if int(data.get("depth", 1)) > 1:
        prompt += ("\n\nSome records below are earlier summaries: keep the refs they cite and their "
                   "receipt states; do not upgrade a claim into a fact.")
    return {"prompt": prompt}
