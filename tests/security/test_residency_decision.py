"""Residency the global tier decided, enforced where the request lands (issue 16 item 4):
country rules held only at the global tier, so a client calling a regional router directly
walked around them. Now the global tier signs its decision and routers check it."""

from __future__ import annotations

import aiohttp
import pytest
from gpuroute.global_.server import GLOBAL_REQUEST_DROP
from support.live import router_server, scripted_backend
from support_security import RecordingEngine, chat, secure_toml

from gpuroute.relay import forward_headers
from gpuroute.residency_decision import HEADER, TTL_S, DecisionError, sign, verify

KEY = b"shared-between-the-tiers"
EU = frozenset({"eu"})
JSON = {"Content-Type": "application/json"}


def test_a_decision_verifies_only_unaltered_unexpired_and_under_the_key() -> None:
    signed = sign(frozenset({"eu"}), KEY, now=1000.0)
    assert verify(signed, KEY, now=1000.0 + TTL_S) == frozenset({"eu"})
    assert verify(sign(None, KEY, now=1000.0), KEY, now=1000.0) is None  # anywhere
    tampered = signed.replace(";eu;", ";eu,us;")
    for bad, now in ((tampered, 1000.0), (signed, 1001.0 + TTL_S), ("v1;eu;9", 1000.0)):
        with pytest.raises(DecisionError):
            verify(bad, KEY, now)
    with pytest.raises(DecisionError):
        verify(signed, b"another key", 1000.0)


def test_the_global_tier_never_passes_on_a_client_decision() -> None:
    headers = forward_headers([(HEADER, "v1;*;9999999999;forged")], GLOBAL_REQUEST_DROP)
    assert HEADER not in {k.lower() for k in headers}


@pytest.mark.asyncio
async def test_a_router_serves_only_what_the_global_tier_let_through(tmp_path) -> None:
    import time

    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        region = (
            'name = "eu-west"\njurisdiction = "eu"\ndecision_key = "shared-between-the-tiers"\n'
            "require_global_decision = true"
        )
        async with router_server(secure_toml(url, region=region), tmp_path) as server:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            now = time.time()
            cases = [
                ({}, 403, "global_decision_required"),  # straight to the regional router
                ({HEADER: sign(frozenset({"us"}), KEY, now)}, 403, "residency_violation"),
                (
                    {HEADER: sign(frozenset({"eu"}), b"guessed", now)},
                    403,
                    "invalid_residency_decision",
                ),
                ({HEADER: sign(EU, KEY, now)}, 200, None),
                ({HEADER: sign(None, KEY, now)}, 200, None),
            ]
            async with aiohttp.ClientSession() as s:
                for extra, status, code in cases:
                    async with s.post(base, data=chat(), headers={**JSON, **extra}) as r:
                        assert r.status == status, (extra, await r.text())
                        if code:
                            assert (await r.json())["error"]["code"] == code
    assert len(engine.seen) == 2
    assert all(HEADER not in {k.lower() for k in h} for _, h, _ in engine.seen)


def test_a_router_checking_decisions_must_know_its_jurisdiction() -> None:
    """The global tier's decisions name jurisdictions (eu, us), never regions: a router
    without one would refuse every EU-bound request it is meant to serve."""
    from gpuroute.router.config import RegionConfig

    with pytest.raises(ValueError, match=r"set region\.jurisdiction too"):
        RegionConfig(name="eu-west", decision_key="k")
    with pytest.raises(ValueError, match=r"set region\.decision_key too"):
        RegionConfig(name="eu-west", jurisdiction="eu", require_global_decision=True)
