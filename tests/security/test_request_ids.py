"""Issue 42 finding 10: a tenant reused another's `x-request-id`, and `/admin/explain/{id}`
mixed both requests' events, which named no tenant. Each request now has the router's own
id (answered and logged), the client's kept as `client_request_id`, and every event names
its tenant. Also: an admin-added key with `priority: "urgent"` was taken (201) and every
request on it got a 500; admin bodies are checked as the config file's keys are."""

from __future__ import annotations

import logging
import re

import aiohttp
import pytest
from gpuroute.router.api.table import RESPONSE_BY_ID
from support.fake_engine_app import fake_engine_app
from support.global_tier import global_tier
from support.live import async_wait_for, chat_body, holds, router_server, scripted_backend
from support_security import KEY, RecordingEngine, chat, keys_section, secure_toml

from gpuroute.auth import key_digest

pytestmark = pytest.mark.asyncio
OTHER = "sk-tenant-beta"
SHARED_ID = "order-1234"
FRESH_ID = re.compile(r"[0-9a-f]{16}")  # a tier's own id for a request
BY_ID = RESPONSE_BY_ID.replace("{response_id}", "resp_0123456789abcdef")


def two_tenants() -> str:
    beta = f'[[auth.keys]]\nsha256 = "{key_digest(OTHER)}"\ntenant = "beta"'
    return keys_section(beta)


async def test_a_reused_request_id_keeps_two_tenants_requests_apart(tmp_path) -> None:
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, auth=two_tenants())
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            admin = f"http://127.0.0.1:{server.admin_port}/admin/explain/"
            ids = {}
            for key, tenant in ((KEY, "acme"), (OTHER, "beta")):
                headers = {"Authorization": f"Bearer {key}", "x-request-id": SHARED_ID}
                async with s.post(base, data=chat(), headers=headers) as r:
                    assert r.status == 200
                    ids[tenant] = r.headers["x-request-id"]
            explained = {}
            for name in (ids["acme"], ids["beta"], SHARED_ID):
                async with s.get(admin + name) as r:
                    explained[name] = (await r.json())["events"]
    assert SHARED_ID not in ids.values() and ids["acme"] != ids["beta"]
    for tenant, rid in ids.items():  # each id explains its own request, its tenant named
        events = explained[rid]
        assert events and {(e["request_id"], e["tenant"]) for e in events} == {(rid, tenant)}
        assert {e["client_request_id"] for e in events} == {SHARED_ID}
    # the client's id finds both, each event naming which request and whose it was
    both = {(e["request_id"], e["tenant"]) for e in explained[SHARED_ID]}
    assert both == {(ids["acme"], "acme"), (ids["beta"], "beta")}


async def test_refusals_name_their_tenant_and_the_clients_id(tmp_path) -> None:
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, auth=two_tenants())
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            headers = {"Authorization": f"Bearer {OTHER}", "x-request-id": SHARED_ID}
            async with s.post(base, data=b"{not json", headers=headers) as r:
                assert r.status == 400
                rid = r.headers["x-request-id"]
            events = server.servable.decisions.explain(rid)
    assert [(e["event"], e["tenant"], e["client_request_id"]) for e in events] == [
        ("refused", "beta", SHARED_ID)
    ]


async def test_every_route_answers_an_id_of_its_own_the_clients_kept_beside_it(
    tmp_path, caplog
) -> None:
    """Found by review: `GET /v1/models` and the stored responses' by-id routes never took
    an id of their own: two tenants sending one `x-request-id` were both answered and logged
    under it (and no `client_request_id`). Now every route's request has the router's id."""
    caplog.set_level(logging.INFO, logger="gpuroute.access")
    routes = [("GET", "/v1/models"), ("GET", BY_ID), ("DELETE", BY_ID), ("POST", BY_ID + "/cancel")]
    answered: list[tuple[str, str]] = []
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, auth=two_tenants())
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}"
            for method, path in routes:
                for key in (KEY, OTHER):
                    headers = {"Authorization": f"Bearer {key}", "x-request-id": SHARED_ID}
                    async with s.request(method, base + path, headers=headers) as r:
                        assert r.status < 500, await r.text()
                        answered.append((path, r.headers["x-request-id"]))
    ids = [rid for _, rid in answered]
    assert all(FRESH_ID.fullmatch(rid) for rid in ids) and len(set(ids)) == len(ids), ids
    lines = [r for r in caplog.records if r.name == "gpuroute.access"]
    logged = {r.request_id: r.client_request_id for r in lines}  # type: ignore[attr-defined]
    by_id = [rid for path, rid in answered if path != "/v1/models"]  # (models: no line)
    assert {rid: logged.get(rid) for rid in by_id} == dict.fromkeys(by_id, SHARED_ID)


async def test_the_global_tier_answers_its_own_id_and_logs_the_clients_and_the_routers(
    tmp_path, caplog
) -> None:
    """Found by review: the global tier answered a client's valid id as it came (the router
    behind took it for its client's), and its access line's "id the router gave it" was
    read from its own answer, which for a stream carried its own id by then. Now it answers
    an id of its own, logs the client's as `client_request_id` and the router's (read from
    the router's answer) as `router_request_id`, for whole answers and streams alike."""
    caplog.set_level(logging.INFO, logger="gpuroute.access")
    answers: dict[bool, str] = {}
    async with fake_engine_app() as engine:
        async with router_server(secure_toml(engine.url), tmp_path) as router:
            region = f"http://127.0.0.1:{router.port}"
            async with global_tier(tmp_path, region) as (url, _), aiohttp.ClientSession() as s:
                chats, headers = url + "/v1/chat/completions", {"x-request-id": SHARED_ID}
                for stream in (False, True):
                    body = chat_body(stream=stream)
                    async with s.post(chats, json=body, headers=headers) as r:
                        assert r.status == 200, await r.text()
                        await r.read()
                        answers[stream] = r.headers["x-request-id"]

                def access() -> list[logging.LogRecord]:
                    return [r for r in caplog.records if r.name == "gpuroute.access"]

                await async_wait_for(holds(lambda: len(access()) == 4), 5, "four access lines")
    at_global = {r.request_id: r for r in access() if hasattr(r, "region")}  # type: ignore[attr-defined]
    at_router = {r.client_request_id: r for r in access() if hasattr(r, "backend")}  # type: ignore[attr-defined]
    assert answers[False] != answers[True]
    for stream, rid in answers.items():
        assert FRESH_ID.fullmatch(rid), (stream, rid)  # the global tier's own, not the client's
        line, behind = at_global[rid], at_router[rid]  # the router got ours as its client's
        assert line.client_request_id == SHARED_ID, stream  # type: ignore[attr-defined]
        assert FRESH_ID.fullmatch(behind.request_id) and behind.request_id != rid  # type: ignore[attr-defined]
        assert line.router_request_id == behind.request_id, stream  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/admin/keys", {"key": "sk-new", "tenant": "t", "priority": "urgent"}, "priority"),
        ("/admin/keys", {"key": "sk-new", "tenant": "t", "slo_class": "platinum"}, "slo_class"),
        ("/admin/keys", {"key": "sk-new", "tenant": "t", "residency": ["eu"]}, "residency"),
        ("/admin/keys", {"key": "sk-new", "tenant": "t", "models": []}, "models"),
        ("/admin/keys", {"key": "sk-new", "tenant": "t", "max_in_flight": 0}, "max_in_flight"),
        ("/admin/backends", {"url": "http://127.0.0.1:9", "gpu": "Z999", "models": ["m"]}, "gpu"),
    ],
    ids=["priority", "slo_class", "residency", "models", "max_in_flight", "backend-gpu"],
)
async def test_admin_bodies_are_checked_as_the_config_files_are(tmp_path, path, body, field):
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, auth=keys_section())
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            admin = f"http://127.0.0.1:{server.admin_port}"
            async with s.post(admin + path, json=body) as r:
                status, answer = r.status, await r.json()
            headers = {"Authorization": "Bearer sk-new"}
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            async with s.post(base, data=chat(), headers=headers) as r:
                used = r.status
    assert status == 400, answer
    assert answer["error"]["param"] == field and field in answer["error"]["message"]
    assert used == 401  # no key was added (before: 201, then 500 on every request)
