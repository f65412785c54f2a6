"""Membership from Consul's health entries, as pure functions: what the catalog says, and
what must change in the backend set for it.

Consul carries membership and health *transitions* only; load comes over the agents'
streams (DESIGN.md). A critical or departed member takes no new requests but keeps the ones
it has; a member back from critical, or a new one, re-enters through slow start. A member
whose agent stands by (Meta `standby = "true"`: warm, model loaded) is kept out of rotation
(STANDBY) unless this router brought it in (router/core/standby.py); one that turns active
comes in at once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuroute.router.core.agent_load import SERVING_HEALTH
from gpuroute.router.core.backend import ROUTABLE_STATES, Backend, BackendSet, BackendState
from gpuroute.router.core.standby import PROMOTED

AGENT_REASON = "agent"  # prefix of the state reasons `follow_agent` sets
STATUS_RANK = {"passing": 0, "warning": 1, "critical": 2, "maintenance": 2}
MEMBERSHIP_REASON = "consul"  # prefix of every state reason this module sets
STANDBY_REASON = f"{MEMBERSHIP_REASON}: standby"
ACTIVE_REASON = f"{MEMBERSHIP_REASON}: active"
# An advertised capacity is relative to an H100 serving the model shape (1.0): anything near
# this bound is a lie that would pull the region's traffic onto one entry.
MAX_CAPACITY = 16.0


@dataclass(frozen=True, slots=True)
class Member:
    backend_id: str
    url: str  # http://address:port of the engine
    gpu: str
    models: tuple[str, ...]
    status: str  # worst of the entry's checks: passing, warning or critical
    output: str = ""
    capacity: float | None = None
    load_address: str | None = None  # host:port of the agent's gRPC load stream
    region: str = ""
    zone: str = ""
    tp: int = 1  # tensor-parallel degree of its engine
    pp: int = 1  # pipeline-parallel degree
    adapters: tuple[str, ...] = ()  # which of `models` are LoRA adapters
    standby: bool = False  # its agent stands by: warm, out of rotation until brought in

    @property
    def routable(self) -> bool:
        return self.status in ("passing", "warning")


def members_from_entries(
    entries: Iterable[Mapping[str, Any]], known_gpus: Iterable[str]
) -> tuple[dict[str, Member], list[str]]:
    """Parse /v1/health/service entries; entries gpuroute cannot use are reported, not kept.
    An ID registered on two nodes is neither: a `service:write` token could register a real
    agent's ID on its own node to borrow that agent's proven load stream."""
    entries, problems = _registered_once(entries)
    gpus = set(known_gpus)
    members: dict[str, Member] = {}
    for entry in entries:
        service = entry.get("Service") or {}
        node = entry.get("Node") or {}
        sid = service.get("ID") or ""
        meta = service.get("Meta") or {}
        address = service.get("Address") or node.get("Address") or ""
        port = service.get("Port") or 0
        gpu = meta.get("gpu_model", "")
        models = tuple(m for m in (meta.get("models") or "").split(",") if m)
        if not sid or not address or not port:
            problems.append(f"entry without ID, address or port: {sid or '?'}")
            continue
        if gpu not in gpus or not models:
            problems.append(f"{sid}: unknown gpu_model {gpu!r} or no models in Meta")
            continue
        checks = entry.get("Checks") or []
        worst = max(checks, key=_severity, default=None)
        # an entry without a check proves nothing about its engine: never routable
        status = "critical" if worst is None else worst.get("Status", "critical")
        if status not in STATUS_RANK:
            status = "critical"
        try:
            capacity, load_port, tp, pp = _numbers(meta)
        except ValueError as exc:
            problems.append(f"{sid}: {exc}")
            continue
        scheme = meta.get("scheme", "http")
        if scheme not in ("http", "https"):
            problems.append(f"{sid}: scheme {scheme!r} in Meta is not http or https")
            continue
        host = f"[{address}]" if ":" in address else address
        members[sid] = Member(
            backend_id=sid,
            url=f"{scheme}://{host}:{port}",
            gpu=gpu,
            models=models,
            status=status,
            output=(worst or {}).get("Output", "") if worst is not None else "",
            capacity=capacity if capacity and capacity > 0 else None,
            load_address=f"{host}:{load_port}" if load_port else None,
            region=meta.get("region", ""),
            zone=meta.get("zone", ""),
            tp=tp,
            pp=pp,
            adapters=tuple(a for a in (meta.get("lora_adapters") or "").split(",") if a in models),
            standby=meta.get("standby") == "true",
        )
    return members, problems


def _registered_once(
    entries: Iterable[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The entries whose service ID no other entry has, and a problem for each ID that
    several have (each node registers its own IDs; the same ID twice is a forgery)."""
    entries = list(entries)
    ids = [(e.get("Service") or {}).get("ID") or "" for e in entries]
    seen = Counter(ids)
    twice = [f"{sid}: registered {n} times (on several nodes): none kept"
             for sid, n in seen.items() if sid and n > 1]  # fmt: skip
    # an entry without an ID goes on, to be reported as such
    once = [e for e, sid in zip(entries, ids, strict=True) if not sid or seen[sid] == 1]
    return once, twice


def _numbers(meta: Mapping[str, Any]) -> tuple[float | None, int | None, int, int]:
    """Capacity, load port and parallel degrees from Meta; ValueError saying what is wrong."""
    try:
        capacity = float(meta["capacity"]) if meta.get("capacity") else None
        load_port = int(meta["load_port"]) if meta.get("load_port") else None
        # an agent before tensor_parallel in Meta ran one engine on all its GPUs
        tp = int(meta.get("tensor_parallel") or meta.get("gpu_count") or 1)
        pp = int(meta.get("pipeline_parallel") or 1)
    except ValueError:
        raise ValueError("capacity, load_port or a parallel degree is not a number") from None
    if capacity is not None and not 0 < capacity <= MAX_CAPACITY:
        raise ValueError(f"capacity {capacity:g} in Meta outside (0, {MAX_CAPACITY}]")
    if not (1 <= tp <= 64 and 1 <= pp <= 64):
        raise ValueError(f"parallel degrees {tp}×{pp} in Meta outside 1..64")
    return capacity, load_port, tp, pp


@dataclass(slots=True)
class MembershipChanges:
    joined: list[Member] = field(default_factory=list)
    down: list[str] = field(default_factory=list)  # critical now: drain
    up: list[str] = field(default_factory=list)  # back from critical: slow start
    left: list[str] = field(default_factory=list)  # gone from the catalog: drain, then remove
    standby: list[str] = field(default_factory=list)  # its agent stands by: out of rotation
    active: list[str] = field(default_factory=list)  # its agent is active again: in rotation

    def __bool__(self) -> bool:
        return bool(self.joined or self.down or self.up or self.left or self.standby or self.active)


def plan(
    backends: BackendSet,
    managed: Iterable[str],
    members: Mapping[str, Member],
    vouched: Collection[str] = (),
) -> MembershipChanges:
    """What to change so the managed part of `backends` follows `members`.

    Backends not in `managed` (static ones from the config) are never touched. A backend
    missing from the catalog but `vouched` for is kept: pass only what `kept_by_agents`
    allows, so that holds just after Consul came back."""
    managed = set(managed)
    changes = MembershipChanges()
    for sid, member in members.items():
        if sid not in backends:
            changes.joined.append(member)
            continue
        if sid not in managed:
            continue
        if (change := _change(backends.get(sid), member)) is not None:
            getattr(changes, change).append(sid)
    changes.left = sorted(
        sid for sid in managed if sid in backends and sid not in members and sid not in vouched
    )
    return changes


def _change(backend: Backend, member: Member) -> str | None:
    """Which list of MembershipChanges a managed backend goes in, if any. Critical wins
    over standby; a backend this router promoted stays in while its agent stands by."""
    state, promoted = backend.state, backend.reason == PROMOTED
    if not member.routable:
        in_service = state in ROUTABLE_STATES or state is BackendState.STANDBY
        return "down" if in_service else None
    if state is BackendState.DRAINING and backend.reason.startswith(MEMBERSHIP_REASON):
        return "standby" if member.standby else "up"
    if member.standby:
        return "standby" if state in ROUTABLE_STATES and not promoted else None
    if state is BackendState.STANDBY or (promoted and state in ROUTABLE_STATES):
        return "active"
    return None


def recovered(before: Mapping[str, Member], after: Mapping[str, Member]) -> list[str]:
    """Members whose checks pass again after failing (critical before, routable now)."""
    return sorted(
        sid
        for sid, member in after.items()
        if member.routable and sid in before and not before[sid].routable
    )


def apply(
    backends: BackendSet,
    changes: MembershipChanges,
    members: Mapping[str, Member],
    now: float,
    *,
    capacity_of,
    warm: bool,
    kind_of=lambda member: member.gpu,
) -> list[Backend]:
    """Apply a plan; returns the backends that joined. `capacity_of(member)` fills in a
    capacity the agent did not advertise, `kind_of(member)` names its engine kind (what its
    priors are kept by); `warm=False` on the first sync (no slow start)."""
    added = []
    for member in changes.joined:
        backend = Backend(
            member.backend_id,
            kind_of(member),
            member.models,
            capacity=member.capacity or capacity_of(member),
            address=member.url,
            zone=member.zone or None,
            gpu=member.gpu,
            gpus=member.tp * member.pp,
            lora_models=member.adapters,
        )
        backends.add(backend, now, warm=warm)
        if not member.routable:
            backends.set_state(
                backend, BackendState.DRAINING, now, f"{MEMBERSHIP_REASON}: critical"
            )
        elif member.standby:
            backends.set_state(backend, BackendState.STANDBY, now, STANDBY_REASON)
        else:
            backend.reason = f"{MEMBERSHIP_REASON}: joined"
        added.append(backend)
    for sid in changes.down:
        reason = members[sid].output or "critical"
        backends.set_state(
            backends.get(sid), BackendState.DRAINING, now, f"{MEMBERSHIP_REASON}: {reason}"
        )
    for sid in changes.up:
        backends.set_state(
            backends.get(sid), BackendState.WARMING, now, f"{MEMBERSHIP_REASON}: back"
        )
    for sid in changes.standby:
        backends.set_state(backends.get(sid), BackendState.STANDBY, now, STANDBY_REASON)
    for sid in changes.active:
        backends.set_state(backends.get(sid), BackendState.READY, now, ACTIVE_REASON)
    for sid in changes.left:
        backend = backends.get(sid)
        if (
            backend.state is not BackendState.DRAINING
            or backend.reason != f"{MEMBERSHIP_REASON}: left"
        ):
            backends.set_state(backend, BackendState.DRAINING, now, f"{MEMBERSHIP_REASON}: left")
    return added


def kept_by_agents(
    vouched: Collection[str], back_at: float | None, now: float, grace_s: float
) -> frozenset[str]:
    """The members missing from the catalog that their agents' streams may keep: only within
    `grace_s` of Consul coming back (a restarted Consul lists nothing until the agents
    register again). Otherwise a member Consul no longer lists has left, whatever a load
    stream says: a stream proves an agent lives, not that the entry it was opened for is
    that agent's (a forged entry can name a real agent's stream)."""
    if back_at is None or not 0 <= now - back_at <= grace_s:
        return frozenset()
    return frozenset(vouched)


def removable(
    backends: BackendSet,
    managed: Iterable[str],
    members: Mapping[str, Member],
    vouched: Collection[str] = (),
) -> list[str]:
    """Departed members with nothing in flight: safe to forget."""
    return [
        sid
        for sid in managed
        if sid in backends
        and sid not in members
        and sid not in vouched
        and backends.get(sid).in_flight == 0
    ]


def _severity(check: Mapping[str, Any]) -> tuple[int, bool]:
    """Worst status first; among equals prefer the service's own check over serfHealth,
    whose output says less."""
    return STATUS_RANK.get(check.get("Status"), 2), check.get("CheckID") != "serfHealth"


def follow_agent(backends: BackendSet, backend: Backend, health: str, now: float) -> None:
    """An agent's drain or critical reaches the router before Consul's does: stop sending
    at once; when the agent serves again, ramp back in (only if the agent took it out)."""
    if health in ("draining", "critical") and backend.state in ROUTABLE_STATES:
        backends.set_state(backend, BackendState.DRAINING, now, f"{AGENT_REASON}: {health}")
    elif (
        health in SERVING_HEALTH
        and backend.state is BackendState.DRAINING
        and backend.reason.startswith(AGENT_REASON)
    ):
        backends.set_state(backend, BackendState.WARMING, now, f"{AGENT_REASON}: {health}")
