"""The global tier's residency decision, signed, for the region that serves the request.

The global tier decides where a request may be served (tenant, client country, header) and
forwards it with

    x-gpuroute-residency-decision: v2;<jurisdictions or *>;<expires>;<key>;<nonce>;<hmac>

an HMAC-SHA256 under a key both tiers share. A decision is bound to its request, so one
captured on the wire is no bearer token: `<key>` is a digest of the API key the request
carries (`-` for none), which the router compares with the key it reads; `<nonce>` is
fresh for every attempt, and a router accepts it once (router/core/replay.py, shared
through Redis where replicas exist); and it expires within seconds. A router holding the
key refuses (403) a decision that excludes its own region or fails any of these checks;
with `require_global_decision`, it refuses requests that carry none. Clients cannot forge
the header, and the global tier never passes on one they send."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

HEADER = "x-gpuroute-residency-decision"
VERSION = "v2"
ANYWHERE = "*"
NO_KEY = "-"
DEFAULT_TTL_S = 10  # covers the hop and clock skew; the router checks it on arrival
MAX_TTL_S = 60
CLOCK_SKEW_S = 5  # between the tiers' clocks, tolerated on top of MAX_TTL_S


class DecisionError(ValueError):
    """A decision header that is malformed, forged, expired or not this request's."""


@dataclass(frozen=True, slots=True)
class Decision:
    jurisdictions: frozenset[str] | None  # None: anywhere
    expires: int  # Unix seconds
    key: str  # key_binding of the request's API key
    nonce: str


def key_binding(api_key: str | None) -> str:
    """What a decision says of the request's API key: half its sha256, or `-`."""
    if api_key is None:
        return NO_KEY
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def sign(
    jurisdictions: frozenset[str] | None,
    key: bytes,
    now: float,
    *,
    api_key: str | None,
    ttl_s: float = DEFAULT_TTL_S,
    nonce: str | None = None,
) -> str:
    """`jurisdictions` None: no rule applied (anywhere). A fresh nonce unless given."""
    places = ANYWHERE if jurisdictions is None else ",".join(sorted(jurisdictions))
    nonce = nonce if nonce is not None else secrets.token_hex(12)
    body = f"{VERSION};{places};{int(now + ttl_s)};{key_binding(api_key)};{nonce}"
    return f"{body};{_mac(key, body)}"


def verify(value: str, key: bytes, now: float) -> Decision:
    """The decision, if signed under `key` and unexpired; DecisionError otherwise. Binding
    to the request's key and single use are the caller's to check."""
    body, _, mac = value.rpartition(";")
    parts = body.split(";")
    if len(parts) != 5 or parts[0] != VERSION or not parts[4]:
        raise DecisionError("malformed residency decision")
    if not hmac.compare_digest(mac.encode(), _mac(key, body).encode()):
        raise DecisionError("residency decision with a bad signature")
    try:
        expires = int(parts[2])
    except ValueError:
        raise DecisionError("malformed residency decision") from None
    if now > expires:
        raise DecisionError("expired residency decision")
    if expires > now + MAX_TTL_S + CLOCK_SKEW_S:  # a clock far ahead would mint tokens
        raise DecisionError("residency decision valid for longer than any global tier signs")
    places = None if parts[1] == ANYWHERE else frozenset(parts[1].split(","))
    return Decision(places, expires, parts[3], parts[4])
