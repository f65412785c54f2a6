"""A request's lifetime as one object and one state machine (sans-IO, h11's way).

Everything booked for a request hangs off its `RequestLifetime`: its outstanding work, its
booking in the latency model, the SLO margin it was admitted under, the timing slowness
detection reads, its attempts, the backends it tried, its tenant's slot, its admission slot,
its continuation (`Continued`) and the one typed object the I/O side keeps of it (`shell`:
the router's Exchange, the simulator's SimAttempt). Nothing else keeps per-request state
keyed by its id, so nothing can be left behind: whatever way a request ends, one transition
(`Lifetimes.close`) releases what the core holds and hands back what the shells hold.

The phases and what moves between them are one table, `TRANSITIONS`; an event a phase does
not take raises `LifetimeError` and leaves the lifetime as it was."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.retry import Attempts, RetryBudget, RetrySettings

if TYPE_CHECKING:
    from gpuroute.router.core.latency import LatencyBooking
    from gpuroute.router.core.ledger import WorkBooking
    from gpuroute.router.core.slowness import Timing


class Phase(enum.StrEnum):
    RECEIVED = "received"  # parsed; not yet let in
    QUEUED = "queued"  # waiting in the admission queue for an in-flight slot
    ROUTING = "routing"  # let in, looking for a backend (first attempt or a retry)
    HELD = "held"  # no backend predicted to meet its SLO: waiting while its TTFT lasts
    PLACED = "placed"  # booked on a backend, waiting for its first byte
    STREAMING = "streaming"  # its first bytes reached the client
    DONE = "done"
    FAILED = "failed"
    REFUSED = "refused"
    CANCELLED = "cancelled"  # the client went away


class Event(enum.StrEnum):
    QUEUE = "queue"
    ADMIT = "admit"
    HOLD = "hold"
    PLACE = "place"
    FIRST_BYTE = "first_byte"
    ATTEMPT_FAILED = "attempt_failed"  # before any byte reached the client: route again
    CONTINUE = "continue"  # its engine broke mid-stream: the answer goes on elsewhere
    FINISH = "finish"
    FAIL = "fail"
    REFUSE = "refuse"
    CANCEL = "cancel"


ENDED = frozenset({Phase.DONE, Phase.FAILED, Phase.REFUSED, Phase.CANCELLED})
_ENDINGS = {Event.FAIL: Phase.FAILED, Event.REFUSE: Phase.REFUSED, Event.CANCEL: Phase.CANCELLED}
TRANSITIONS: dict[Phase, dict[Event, Phase]] = {
    Phase.RECEIVED: {Event.QUEUE: Phase.QUEUED, Event.ADMIT: Phase.ROUTING, **_ENDINGS},
    Phase.QUEUED: {Event.ADMIT: Phase.ROUTING, **_ENDINGS},
    Phase.ROUTING: {Event.PLACE: Phase.PLACED, Event.HOLD: Phase.HELD, **_ENDINGS},
    Phase.HELD: {Event.PLACE: Phase.PLACED, Event.ADMIT: Phase.ROUTING, **_ENDINGS},
    Phase.PLACED: {
        Event.FIRST_BYTE: Phase.STREAMING,
        Event.ATTEMPT_FAILED: Phase.ROUTING,
        Event.FINISH: Phase.DONE,
        **_ENDINGS,
    },
    Phase.STREAMING: {
        Event.FINISH: Phase.DONE,
        Event.CONTINUE: Phase.ROUTING,
        Event.FAIL: Phase.FAILED,
        **_ENDINGS,
    },
    **{phase: {} for phase in ENDED},
}


@dataclass(slots=True)
class Continued:
    """A stream that broke mid-answer (or was moved) and goes on elsewhere, as its client
    saw it: its one home, on its lifetime, for the live router and the simulator alike."""

    first_token_at: float  # the client's first token (its TTFT stays this one)
    delivered: int  # tokens the client has had: the continuation's prompt holds them
    continuations: int = 0  # times it went on elsewhere (`max_attempts` bounds it)
    # when the continuation's first bytes reached the client: its engine is judged from
    # there, on the tokens after `delivered` (the live relay's; None: not yet)
    resumed_at: float | None = None


class LifetimeError(RuntimeError):
    """An event its phase does not take: a bug in whoever fed it (the lifetime is unchanged)."""


S = TypeVar("S")  # what the I/O side keeps of a request (router: Exchange; sim: SimAttempt)


class RequestLifetime(Generic[S]):
    """One request from arrival to its end, and everything booked for it meanwhile; what
    the I/O side keeps of it is one typed object, its `shell`."""

    __slots__ = (
        "admitted",
        "attempts",
        "continued",
        "info",
        "latency",
        "model",
        "needed",
        "phase",
        "sampled",
        "shell",
        "tenant",
        "timing",
        "tried",
        "work",
    )

    def __init__(self, info: RequestInfo, attempts: Attempts | None = None) -> None:
        self.info = info
        self.phase = Phase.RECEIVED
        self.attempts = attempts if attempts is not None else Attempts(RetrySettings())
        self.tried: set[str] = set()  # backends an attempt went to
        self.work: WorkBooking | None = None  # its outstanding work (scheduler's ledger)
        self.latency: LatencyBooking | None = None  # its booking in the latency model
        self.needed: float | None = None  # the SLO margin it needed to be placed
        self.model = info.model  # the model its booking serves (a fallback's, if one took it)
        self.timing: Timing | None = None  # its attempt's clock, for slowness detection
        self.tenant: str | None = None  # the tenant whose in-flight slot it holds
        self.admitted = False  # holds an admission slot
        self.shell: S | None = None  # the I/O side's one object for it (its type: `S`)
        self.sampled = False  # its decision-log events are written out, not only kept
        self.continued: Continued | None = None  # its stream went on elsewhere

    @property
    def request_id(self) -> int | str:
        return self.info.request_id

    @property
    def ended(self) -> bool:
        return self.phase in ENDED

    def continued_or_new(self, first_token_at: float) -> Continued:
        """Its stream's `continued`, made on its first break (the client's first token came
        at `first_token_at`, nothing delivered yet)."""
        if self.continued is None:
            self.continued = Continued(first_token_at, 0)
        return self.continued

    def move(self, event: Event) -> Phase:
        """Take `event`; LifetimeError (and no change) when the phase does not take it."""
        after = TRANSITIONS[self.phase].get(event)
        if after is None:
            raise LifetimeError(f"request {self.request_id!r}: {event} in phase {self.phase}")
        self.phase = after
        return after

    def __repr__(self) -> str:
        return f"RequestLifetime({self.request_id!r}, {self.phase})"


@dataclass(frozen=True, slots=True)
class Released:
    """What a closed request held outside the core, for the shells to give back."""

    tenant: str | None = None  # its tenant's in-flight slot
    admitted: bool = False  # its admission slot
    ended_now: bool = True  # False: it had ended before (a second close changes nothing)
    freed: bool = False  # it still held a backend booking: room for held requests


NOTHING = Released(ended_now=False)
# what most closes return (no tenant slot, no admission slot): shared, it is frozen
_FREED, _KEPT = Released(freed=True), Released(freed=False)


class Releases(Protocol):
    """Who holds a request's bookings (the scheduler: router/core/scheduler.py, which builds
    on this module and so is not imported here)."""

    def release(self, life: RequestLifetime) -> bool: ...


class Lifetimes(Generic[S]):
    """The requests in flight: the one table keyed by request id. Every request enters by
    `open` and leaves by `close`, which releases what it still holds."""

    def __init__(
        self, settings: RetrySettings | None = None, scheduler: Releases | None = None
    ) -> None:
        self.settings = settings or RetrySettings()
        self.scheduler = scheduler  # whose bookings a close releases
        self.budget = RetryBudget(self.settings)  # counts the requests in flight
        self._live: dict[int | str, RequestLifetime[S]] = {}

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[RequestLifetime[S]]:
        return iter(self._live.values())

    def get(self, request_id: int | str) -> RequestLifetime[S] | None:
        return self._live.get(request_id)

    def open(self, info: RequestInfo) -> RequestLifetime[S]:
        if info.request_id in self._live:
            raise LifetimeError(f"request {info.request_id!r} is already in flight")
        life: RequestLifetime[S] = RequestLifetime(info, Attempts(self.settings))
        self._live[info.request_id] = life
        self.budget.active += 1
        return life

    def close(self, life: RequestLifetime[S], event: Event) -> Released:
        """End the request by `event` (FINISH, FAIL, REFUSE or CANCEL), in one transition:
        whatever booking is still open is released with no verdict (what ended well was
        finished with its verdict before), its timing and its I/O state are dropped, it
        leaves the table and the retry budget's count. Returns what the shells hold for it
        (its tenant's slot, its admission slot); NOTHING for one that had ended already (the
        second of two endings, e.g. an error after a disconnect)."""
        if life.ended:
            return NOTHING
        # an ending its phase does not take still ends it (as a failure): a close that
        # raised would leave every booking behind
        life.move(event if event in TRANSITIONS[life.phase] else Event.FAIL)
        freed = self.scheduler is not None and self.scheduler.release(life)
        life.timing = life.shell = None
        if self._live.pop(life.request_id, None) is not None:
            self.budget.active -= 1
        if life.tenant is None and not life.admitted:
            return _FREED if freed else _KEPT
        released = Released(life.tenant, life.admitted, freed=freed)
        life.tenant, life.admitted = None, False
        return released
