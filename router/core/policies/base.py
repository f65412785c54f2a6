"""The one interface every load-balancing policy implements: its stages.

A pick runs as llm-d's pipeline: the scheduler's candidates → the policy's `shortlist`
(sample, predict, filter: a predicting policy drops the backends predicted to miss the SLO,
and says so when nothing fits) → the session's remembered backend if it survived the filter,
else the policy's `pick` (score, pick) → `placed` (what the policy learns of where it went).
Policies see only core types. They read load through one interface (load.py) and costs
through PickContext; they never change load themselves (the ledger does). When the
context carries a `PickTrace`, each stage writes down what it did, for the decision log.

A policy declares what it is built from: `Settings`, a frozen dataclass of its typed
settings (a config's `[policy_settings.<name>]` table, checked by `settings_from`), and
`from_settings`, which builds it from those and the fleet's facts (`PolicyFacts`). The one
builder (policies/__init__.py) is all the router, reload, the simulator and the benches
call."""

from __future__ import annotations

import dataclasses
import math
import random
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, Self

from gpuroute.router.core.backend import Backend, BackendSet, BackendState
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.latency import LatencyModel, Prediction
from gpuroute.router.core.policies.prefix_index import PrefixIndex
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.slo import STANDARD

READY = BackendState.READY
S = typing.TypeVar("S")


@dataclass(frozen=True, slots=True)
class Verdict:
    """A policy's choice: where, what it predicts there (predicting policies), and whether
    that meets the request's SLO (a miss is held or refused by SLO-aware admission)."""

    backend: Backend
    prediction: Prediction | None = None
    fits: bool = True
    preferred: bool = False  # the session's remembered backend
    needed: float | None = None  # the SLO margin it needed to fit (its verdict moves margins)


@dataclass(slots=True)
class Shortlist:
    """What a policy's filter stage kept of the candidates, with what it predicted there;
    `miss` when nothing fits: the least-violating backend, for admission to hold or refuse."""

    kept: Sequence[Backend]
    predictions: dict[Backend, Prediction] | None = None
    miss: Verdict | None = None
    waited: float = 0.0  # how long the request had waited (its TTFT budget shrank by it)


class PickTrace:
    """Each stage of one pick, written down as it ran (only when asked for: the decision
    log, `gpuroute explain`). One row per backend a stage looked at, keyed by its id."""

    __slots__ = ("candidates", "excluded", "fallback", "full", "margin", "rows", "sampled")

    def __init__(self, *, full: bool = False) -> None:
        # full: every exclusion and, for policies that do not trace their own scores,
        # every candidate's score (O(fleet) per pick: for sampled requests only)
        self.full = full
        self.candidates = 0  # the scheduler's candidates (routable, not tried, ...)
        self.excluded: dict[str, str] = {}  # backend → why it was no candidate
        self.sampled: int | None = None  # how many a large pool's sampler kept
        self.rows: dict[str, dict[str, object]] = {}  # backend → its prediction, verdict, score
        self.margin: float | None = None  # the SLO margin the chosen backend needed
        self.fallback: str | None = None  # the fallback model it was placed for, if one

    def row(self, backend: Backend) -> dict[str, object]:
        row = self.rows.get(backend.backend_id)
        if row is None:
            row = self.rows[backend.backend_id] = {"gpu": backend.gpu_type}
        return row


class PickContext:
    """Everything a policy may consult for one decision; costs are memoised per GPU type."""

    __slots__ = (
        "_costs",
        "backends",
        "estimator",
        "expected_output",
        "latency",
        "now",
        "preferred",
        "request",
        "rng",
        "shortlist",
        "slo",
        "trace",
        "ttft_cap",
    )

    def __init__(
        self,
        request: RequestInfo,
        backends: BackendSet,
        estimator: CostEstimator,
        now: float,
        rng: random.Random,
        latency: LatencyModel | None = None,
        preferred: str | None = None,
        trace: PickTrace | None = None,
    ) -> None:
        self.request = request
        self.backends = backends
        self.estimator = estimator
        self.now = now
        self.rng = rng
        self.latency = latency
        self.preferred = preferred  # a session's remembered backend
        self.trace = trace  # each stage's record, when the pick is to be explained
        self.shortlist: Shortlist | None = None  # what the filter stage kept (its predictions)
        self.slo = request.slo or STANDARD  # a request no front classified
        # the longest wait for a first token this pick may create (a more important class
        # is in the traffic: the queue it would deepen is one that class may wait in)
        self.ttft_cap = math.inf
        self.expected_output = estimator.expected_output(
            request.model, request.max_tokens, request.prompt_tokens
        )
        self._costs: dict[tuple[str, float], float] = {}

    def cost_on(self, backend: Backend) -> float:
        """GPU-seconds this request would cost on `backend`."""
        key = (backend.gpu_type, backend.capacity)
        cost = self._costs.get(key)
        if cost is None:
            cost = self.estimator.seconds(
                backend.gpu_type, backend.capacity, self.request.prompt_tokens, self.expected_output
            )
            self._costs[key] = cost
        return cost

    def capacity_of(self, backend: Backend) -> float:
        """Nominal capacity weight, reduced while the backend warms up."""
        if backend.state is READY:
            return backend.capacity
        return self.backends.effective_capacity(backend, self.now)

    def warmup_factor(self, backend: Backend) -> float:
        if backend.state is READY:
            return 1.0
        return self.backends.slow_start.factor(self.now - backend.state_since)


class SettingError(ValueError):
    """A policy setting that cannot be used; the message starts with the key it names
    (`slo_aware.cost_weight: must be >= 0`), which a config prefixes with its table."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True, slots=True)
class NoSettings:
    """The settings of a policy that takes none."""


@dataclass(frozen=True, slots=True)
class PolicyFacts:
    """What the fleet, not the policy's settings, tells a policy: $/hour per GPU type (the
    declared [[gpu_types]] prices and [slo] gpu_prices; slo_aware's cost scorer)."""

    gpu_prices: Mapping[str, float] = field(default_factory=dict)


def settings_from(kind: type[S], table: Mapping[str, object], owner: str = "") -> S:
    """`table` (a TOML table of settings) as the frozen dataclass `kind`: an unknown key or a
    value of the wrong type is a SettingError naming `owner.key` (integers pass for floats,
    as TOML writes `1` for 1.0); range checks are the dataclass's own `__post_init__`."""
    prefix = f"{owner}." if owner else ""
    names = [f.name for f in dataclasses.fields(kind)]  # type: ignore[arg-type]
    hints = typing.get_type_hints(kind)
    values: dict[str, object] = {}
    for key, value in table.items():
        if key not in names:
            known = ", ".join(names) or "none"
            raise SettingError(f"{prefix}{key}", f"unknown setting; known: {known}")
        values[key] = _typed(f"{prefix}{key}", value, hints[key])
    try:
        return kind(**values)
    except SettingError as exc:
        raise SettingError(f"{prefix}{exc.key}", str(exc).removeprefix(f"{exc.key}: ")) from None


def _typed(key: str, value: object, kind: object) -> object:
    """`value` as a setting of type `kind` (int, float, bool or str), else a SettingError."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # True is an int to Python, never to a setting
    if (
        isinstance(kind, type)
        and isinstance(value, kind)
        and (kind is bool or not isinstance(value, bool))
    ):
        return value
    name = getattr(kind, "__name__", str(kind))
    raise SettingError(key, f"expected {_KIND_WORDS.get(name, name)}, got {value!r}")


_KIND_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def check(ok: bool, key: str, message: str) -> None:
    """A settings dataclass's range check: SettingError naming `key` unless `ok`."""
    if not ok:
        raise SettingError(key, message)


class Policy(Protocol):
    """Chooses one backend among non-empty `candidates`, stage by stage (module docstring)."""

    name: ClassVar[str]
    # its typed settings (a frozen dataclass; NoSettings when it takes none)
    Settings: ClassVar[type]
    # the prefix index it keeps and learns placements into (None when it keeps none): the
    # shells share it with peer replicas and workers
    prefix_index: PrefixIndex | None
    # request data the policy reads beyond size and model ("prefix_blocks", "session_id"),
    # so a shell computes it only for policies that use it
    needs: ClassVar[frozenset[str]]
    # its filter predicts SLO misses (`Shortlist.miss`), which admission can hold
    predicts_slo: ClassVar[bool]
    # its pick writes each candidate's score terms into the trace (else the scheduler
    # records `score` of each candidate for it)
    traces_scores: ClassVar[bool]

    @classmethod
    def from_settings(cls, settings: typing.Any, facts: PolicyFacts) -> Self:
        """A fresh instance with these settings (an instance of its `Settings`)."""
        ...

    def shortlist(self, ctx: PickContext, candidates: Sequence[Backend]) -> Shortlist:
        """Sample, predict and filter: the backends a pick may choose among."""
        ...

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        """Score and pick among what the shortlist kept."""
        ...

    def placed(self, ctx: PickContext, backend: Backend, *, preferred: bool) -> Verdict:
        """The request goes to `backend`: what the policy predicts there and learns of it."""
        ...

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        """The number the policy ranks by (lower is better), for the decision log."""
        ...

    def observe_slo(
        self, needed: float | None, met: bool, backend: Backend, now: float, slo: str = ""
    ) -> None:
        """A request of SLO class `slo` it placed ended, meeting its SLO or not (`needed`:
        the margin it needed to be placed)."""
        ...


class PolicyBase:
    """The stages a policy that neither predicts nor filters leaves as they are."""

    Settings: ClassVar[type] = NoSettings
    needs: ClassVar[frozenset[str]] = frozenset()
    predicts_slo: ClassVar[bool] = False
    traces_scores: ClassVar[bool] = False
    prefix_index: PrefixIndex | None = None

    @classmethod
    def from_settings(cls, settings: typing.Any, facts: PolicyFacts) -> Self:
        """Built from its settings alone (a policy that takes none: from nothing)."""
        return cls() if cls.Settings is NoSettings else cls(settings)  # type: ignore[call-arg]

    def shortlist(self, ctx: PickContext, candidates: Sequence[Backend]) -> Shortlist:
        return Shortlist(candidates)

    def placed(self, ctx: PickContext, backend: Backend, *, preferred: bool) -> Verdict:
        return Verdict(backend, preferred=preferred)

    def observe_slo(
        self, needed: float | None, met: bool, backend: Backend, now: float, slo: str = ""
    ) -> None:
        return None


def min_with_random_ties(
    candidates: Sequence[Backend], scores: Sequence[float], rng: random.Random
) -> Backend:
    """The lowest-scoring candidate; exact ties are broken uniformly at random."""
    best = min(scores)
    if best == best and len(scores) == len(candidates) and scores.count(best) == 1:
        return candidates[scores.index(best)]  # one minimum (nearly every pick): no draw
    tied = [c for c, s in zip(candidates, scores, strict=True) if s == best]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


def trace_scores(ctx: PickContext, backends: Sequence[Backend], scores: Sequence[float]) -> None:
    """Write the scores a pick ranked by into the trace, when there is one."""
    if ctx.trace is not None:
        for b, score in zip(backends, scores, strict=True):
            ctx.trace.row(b)["score"] = score
