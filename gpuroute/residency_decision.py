"""The global tier's residency decision, signed, for the region that serves the request.

The global tier decides where a request may be served (tenant, client country, header) and
forwards it with `x-gpuroute-residency-decision: v1;<jurisdictions or *>;<expires>;<hmac>`,
an HMAC-SHA256 under a key both tiers share. A router holding the key checks the signature
and the expiry and refuses (403) a request whose decision excludes its own region; with
`require_global_decision`, it refuses requests that carry none (they did not come through
the global tier). Clients cannot forge the header, and the global tier drops any they send."""

from __future__ import annotations

import hashlib
import hmac

HEADER = "x-gpuroute-residency-decision"
VERSION = "v1"
ANYWHERE = "*"
TTL_S = 60  # longer than any first-byte wait between the tiers, short enough to not replay


class DecisionError(ValueError):
    """A decision header that is malformed, forged or expired."""


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def sign(jurisdictions: frozenset[str] | None, key: bytes, now: float) -> str:
    """`jurisdictions` None: no rule applied (anywhere)."""
    places = ANYWHERE if jurisdictions is None else ",".join(sorted(jurisdictions))
    body = f"{VERSION};{places};{int(now) + TTL_S}"
    return f"{body};{_mac(key, body)}"


def verify(value: str, key: bytes, now: float) -> frozenset[str] | None:
    """The jurisdictions the decision allows (None: anywhere); DecisionError otherwise."""
    body, _, mac = value.rpartition(";")
    parts = body.split(";")
    if len(parts) != 3 or parts[0] != VERSION:
        raise DecisionError("malformed residency decision")
    if not hmac.compare_digest(mac.encode(), _mac(key, body).encode()):
        raise DecisionError("residency decision with a bad signature")
    try:
        expires = int(parts[2])
    except ValueError:
        raise DecisionError("malformed residency decision") from None
    if now > expires:
        raise DecisionError("expired residency decision")
    return None if parts[1] == ANYWHERE else frozenset(parts[1].split(","))
