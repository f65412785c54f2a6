"""What becomes of a stream whose upstream broke after its client's first bytes (pure: both
tiers' shells, gpuroute/continuation/relay.py, apply it): ended as its engine would have,
continued elsewhere, or ended with the explicit error and why."""

from __future__ import annotations

from dataclasses import dataclass

from gpuroute.continuation.seam import holds_back
from gpuroute.continuation.text import (
    Broken,
    ContinuationConfig,
    budget_spent,
    id_prompt,
    read_broken,
    static_reason,
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What becomes of a stream whose upstream broke after the client's first bytes: ended
    as its engine would have (FINISH: `finished`, `length`), continued elsewhere (CONTINUE),
    or ended with the explicit error (END, and why)."""

    action: str
    reason: str | None = None
    broken: Broken | None = None


FINISH, CONTINUE, END = "finish", "continue", "end"


def judge(
    config: ContinuationConfig, route: str, body: dict | None, kept: bytearray | None, tries: int
) -> Verdict:
    """The verdict on a broken stream: `kept` is what its client received (None: not kept,
    or too long to keep), `tries` the continuations it had already. Its finish, or its cap
    spent, comes before whether it could go on."""
    broken = None
    if kept and kept.endswith(b"\n\n"):  # (else half an event reached the client)
        # where its text lags its ids (stop strings held back), it goes on from its text
        broken = read_broken(bytes(kept), route, ids=not holds_back(body or {}))
    if broken is not None and (broken.finished or budget_spent(body or {}, broken)):
        return Verdict(FINISH, "finished" if broken.finished else "length", broken)
    reason = _why_not(config, route, body, kept, broken, tries)
    return Verdict(CONTINUE, None, broken) if reason is None else Verdict(END, reason, broken)


def _why_not(
    config: ContinuationConfig,
    route: str,
    body: dict | None,
    kept: bytearray | None,
    broken: Broken | None,
    tries: int,
) -> str | None:
    """Why the stream cannot go on faithfully (None: it can)."""
    if not config.enabled:
        return "disabled"
    if (reason := static_reason(route, body)) is not None:
        return reason
    if broken is None:  # not kept, or half an event reached the client: nothing can follow
        return "too_long" if kept is None else "torn_event"
    if broken.token_ids is None and id_prompt(body or {}):
        return "prompt_not_text"  # a token-id prompt goes on only from the answer's ids
    if tries >= config.max_attempts:
        return "attempts"
    if broken.unread:
        return "unreadable"  # events it cannot tell the text of: no faithful splice
    if broken.reasoning:
        return "reasoning"
    if broken.tool_calls:
        return "tool_calls"
    return None
