"""Issue 42 item 2 in a real browser: headless Chromium on the tier's host opens an
attacker's page, which tries a cross-site `no-cors` fetch and a `text/plain` form POST
against each tier's tokenless admin listener (the shipped default), then, through its
name rebound to 127.0.0.1 (tests/security/support_browser.py), reads the admin routes
and POSTs JSON as their own origin. Nothing may change, and the page reads nothing."""

from __future__ import annotations

import json

import pytest
from support.components import chromium
from support.live import MODEL, FakeEngineProcess, async_wait_for, router_server, scripted_backend
from support_admin import global_admin_apart
from support_browser import PageAttack, open_in_chromium
from support_security import RecordingEngine, keys_section, secure_toml
from test_agent_admin import agent_config

from gpuroute.auth import key_digest

pytestmark = pytest.mark.asyncio
BACKEND = {"id": "page=form", "url": "http://203.0.113.9:80", "gpu": "H100", "models": [MODEL]}


def key_body(key: str) -> str:
    return json.dumps({"key": key, "tenant": "mallory"})


def refused_everywhere(report: dict, attacks: list[PageAttack]) -> list[str]:
    """What the page could read or change: a same-origin answer other than a 403, or a
    cross-site request whose answer it could see."""
    wrong = []
    for a in attacks:
        seen = report.get(a.name, {})
        if a.how == "same-origin" and seen.get("status") != 403:
            wrong.append(f"{a.name}: {seen}")
        if a.how == "no-cors" and seen.get("text") is not None:
            wrong.append(f"{a.name}: {seen}")
    return wrong


@pytest.fixture(autouse=True)
def _browser() -> None:
    chromium()  # skipped, or failed under GPUROUTE_REQUIRE_COMPONENTS, when there is none


ROUTER_ATTACKS = [
    PageAttack("key-fetch", "no-cors", "POST", "/admin/keys", key_body("sk-page-fetch")),
    PageAttack("key-form", "form", "POST", "/admin/keys", key_body("sk-page=form")),
    PageAttack("backend-form", "form", "POST", "/admin/backends", json.dumps(BACKEND)),
    PageAttack("key-rebound", "same-origin", "POST", "/admin/keys", key_body("sk-page-rebound")),
    PageAttack("config-read", "same-origin", "GET", "/admin/config"),
    PageAttack("keys-read", "same-origin", "GET", "/admin/keys"),
]


async def test_a_page_in_chromium_cannot_use_the_routers_admin_listener(tmp_path) -> None:
    async with scripted_backend(RecordingEngine()) as url:
        async with router_server(secure_toml(url, auth=keys_section()), tmp_path) as server:
            app = server.servable
            before = sorted(b.backend_id for b in app.scheduler.backends)
            report = await open_in_chromium(tmp_path, server.admin_port, ROUTER_ATTACKS)
            keys = app.proxy.front.tenants.quotas.keys
            added = [k for k in ("sk-page-fetch", "sk-page=form", "sk-page-rebound")
                     if key_digest(k) in keys]  # fmt: skip
            backends = sorted(b.backend_id for b in app.scheduler.backends)
    assert added == [] and backends == before, report
    assert refused_everywhere(report, ROUTER_ATTACKS) == []


async def test_a_page_in_chromium_cannot_read_the_global_tiers_admin_listener(tmp_path) -> None:
    attacks = [
        PageAttack("regions-read", "same-origin", "GET", "/admin/regions"),
        PageAttack("metrics-read", "same-origin", "GET", "/metrics"),
    ]
    async with global_admin_apart(tmp_path) as (_admin, port):
        report = await open_in_chromium(tmp_path, port, attacks)
    assert refused_everywhere(report, attacks) == []


async def test_a_page_in_chromium_cannot_use_the_agents_admin_listener(tmp_path) -> None:
    from gpuroute.agent.server import Agent

    attacks = [
        PageAttack("drain-fetch", "no-cors", "POST", "/drain", "{}"),
        PageAttack("standby-form", "form", "POST", "/standby", '{"a": "="}'),
        PageAttack("drain-rebound", "same-origin", "POST", "/drain", "{}"),
        PageAttack("status-read", "same-origin", "GET", "/status"),
    ]
    engine = FakeEngineProcess("H100")
    agent = Agent(agent_config(tmp_path, engine, ""))
    await agent.start()
    try:

        async def passing() -> bool:
            return agent.status()["health"] == "passing"

        await async_wait_for(passing, 10, "agent passing")
        report = await open_in_chromium(tmp_path, agent.admin_port, attacks)
        assert await passing() and agent.standby is False, report
    finally:
        await agent.stop()
        engine.stop()
    assert refused_everywhere(report, attacks) == []
