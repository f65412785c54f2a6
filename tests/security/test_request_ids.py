"""Issue 42 finding 10: a tenant reused another's `x-request-id`, and `/admin/explain/{id}`
mixed both requests' events, which named no tenant. Each request now has the router's own
id (answered and logged), the client's kept as `client_request_id`, and every event names
its tenant. Also: an admin-added key with `priority: "urgent"` was taken (201) and every
request on it got a 500; admin bodies are checked as the config file's keys are."""

from __future__ import annotations

import aiohttp
import pytest
from support.live import router_server, scripted_backend
from support_security import KEY, RecordingEngine, chat, keys_section, secure_toml

from gpuroute.auth import key_digest

pytestmark = pytest.mark.asyncio
OTHER = "sk-tenant-beta"
SHARED_ID = "order-1234"


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
