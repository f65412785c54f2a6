"""Proofs on the agents' load streams, under a token that agents and routers share
(`load_stream.token`, `membership.load_stream_token`).

The token never crosses the wire: a load stream's address comes from Consul Meta, which a
holder of a `service:write` token writes, so a router must not hand its secret to whatever
listens there. The router sends a fresh nonce with a proof that it holds the token; the
agent answers each report with a proof bound to that nonce and to its Consul service ID.
A report relayed from another agent names another backend, and one from a server without
the token has no valid proof."""

from __future__ import annotations

import hashlib
import hmac
import struct

NONCE_BYTES = 16
MAX_SKEW_S = 60.0  # a watch request older or newer than this is refused (replays, clocks)
WATCH = b"gpuroute load watch v1"
REPORT = b"gpuroute load report v1"


def _mac(token: str, *parts: bytes) -> bytes:
    message = b"".join(struct.pack(">I", len(part)) + part for part in parts)
    return hmac.new(token.encode(), message, hashlib.sha256).digest()


def watch_proof(token: str, nonce: bytes, sent_at: float, router_id: str) -> bytes:
    """What a router sends to show it holds the token."""
    return _mac(token, WATCH, nonce, struct.pack(">d", sent_at), router_id.encode())


def report_proof(token: str, nonce: bytes, backend_id: str) -> bytes:
    """What an agent puts in each report: it holds the token and speaks for `backend_id`."""
    return _mac(token, REPORT, nonce, backend_id.encode())


def watch_refusal(
    token: str, nonce: bytes, sent_at: float, router_id: str, proof: bytes, now: float
) -> str | None:
    """Why an agent holding `token` refuses a watch request (None: it accepts it)."""
    if len(nonce) != NONCE_BYTES or not proof:
        return "no proof of the load-stream token"
    if abs(now - sent_at) > MAX_SKEW_S:
        return f"a proof more than {MAX_SKEW_S:g} s away from the agent's clock"
    if not hmac.compare_digest(proof, watch_proof(token, nonce, sent_at, router_id)):
        return "a proof under another load-stream token"
    return None
