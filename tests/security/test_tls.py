"""TLS between tiers (issue 16 item 7), with certificates made at test time and a real
handshake: a listener with a certificate, mutual TLS that refuses a client without one,
and the router reaching an https engine that wants the router's own certificate."""

from __future__ import annotations

import json
import ssl

import aiohttp
import pytest
from aiohttp import web
from gpuroute.testbed.certs import LocalCA
from support.live import router_server
from support_security import ANSWER, chat, secure_toml

pytestmark = pytest.mark.asyncio
JSON = {"Content-Type": "application/json"}


async def tls_engine(ca: LocalCA, tmp_path):
    """An https engine that requires a client certificate signed by `ca`."""
    cert, key = ca.issue("engine")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca.ca_file)
    context.verify_mode = ssl.CERT_REQUIRED

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    return runner, f"https://127.0.0.1:{runner.addresses[0][1]}"


async def test_mutual_tls_from_client_to_router_to_engine(tmp_path) -> None:
    ca = LocalCA(tmp_path)
    runner, engine_url = await tls_engine(ca, tmp_path)
    server_cert, server_key = ca.issue("router")
    router_cert, router_key = ca.issue("router-client", client=True)
    client_cert, client_key = ca.issue("global-tier", client=True)
    text = secure_toml(
        engine_url,
        engine_tls=f'ca_file = "{ca.ca_file}"\ncert_file = "{router_cert}"\n'
        f'key_file = "{router_key}"',
    ).replace(
        "[listen]\nport = 0",
        f'[listen]\nport = 0\n[listen.tls]\ncert_file = "{server_cert}"\n'
        f'key_file = "{server_key}"\nclient_ca_file = "{ca.ca_file}"',
    )
    try:
        async with router_server(text, tmp_path) as server:
            url = f"https://127.0.0.1:{server.port}/v1/chat/completions"
            trusted = ssl.create_default_context(cafile=str(ca.ca_file))
            async with aiohttp.ClientSession() as s:
                with pytest.raises(aiohttp.ClientError):  # no client certificate: refused
                    async with s.post(url, data=chat(), headers=JSON, ssl=trusted) as r:
                        await r.read()
                with pytest.raises(aiohttp.ClientError):  # plaintext: refused
                    plain = url.replace("https://", "http://")
                    async with s.post(plain, data=chat(), headers=JSON) as r:
                        await r.read()
                with_cert = ssl.create_default_context(cafile=str(ca.ca_file))
                with_cert.load_cert_chain(client_cert, client_key)
                async with s.post(url, data=chat(), headers=JSON, ssl=with_cert) as r:
                    assert r.status == 200  # and the router reached the engine over mTLS
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("trusts", "why"),
    [
        ("stranger", "CERTIFICATE_VERIFY_FAILED"),  # the engine's CA is not the router's
        ("ca", None),  # the control: the router trusts the engine's CA, the request is served
    ],
    ids=["unverified", "control"],
)
async def test_a_router_refuses_an_engine_it_cannot_verify(
    tmp_path, caplog, trusts: str, why: str | None
) -> None:
    """A 502 alone (what any failure gives) proved nothing (issue 30): the router's log
    must name the certificate failure, and the right CA must let the same request through
    (the router's own certificate is good in both)."""
    cas = {"ca": LocalCA(tmp_path), "stranger": LocalCA(tmp_path, "another-ca")}
    runner, engine_url = await tls_engine(cas["ca"], tmp_path)
    cert, key = cas["ca"].issue("router-client", client=True)
    text = secure_toml(
        engine_url,
        engine_tls=f'ca_file = "{cas[trusts].ca_file}"\ncert_file = "{cert}"\nkey_file = "{key}"',
    )
    caplog.set_level("WARNING", "gpuroute.router")
    try:
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            async with s.post(url, data=chat(), headers=JSON) as r:
                body = await r.json()
    finally:
        await runner.cleanup()
    if why is None:
        assert r.status == 200 and body == ANSWER
        assert "SSL" not in caplog.text
    else:
        assert r.status == 502 and body["error"]["code"] == "upstream_error"
        assert why in caplog.text, caplog.text
        assert "ssl" not in json.dumps(body).lower()  # the details are for operators only


async def test_agent_load_stream_answers_only_routers_with_a_certificate(tmp_path) -> None:
    """Item 12/7: agents' load streams answered anyone; with `load_stream.tls` and a client
    CA, only a router holding a certificate that CA signed may watch."""
    import time

    import grpc
    from gpuroute.agent.load_stream import (
        AgentLoadService,
        LoadBroadcaster,
        LoadSample,
        start_load_server,
    )

    from gpuroute.config import TlsConfig
    from gpuroute.grpc_server import channel_credentials, open_channel, server_credentials
    from gpuroute.proto import load_pb2, load_pb2_grpc
    from gpuroute.tls import ClientTlsConfig

    ca = LocalCA(tmp_path)
    cert, key = ca.issue("agent")
    router_cert, router_key = ca.issue("router", client=True)
    broadcaster = LoadBroadcaster("engine-a", time.time)
    await broadcaster.publish(LoadSample(running=3, health="passing"))
    tls = TlsConfig(cert_file=str(cert), key_file=str(key), client_ca_file=str(ca.ca_file))
    service = AgentLoadService(broadcaster, 0.25)
    credentials = server_credentials(tls, "load_stream.tls")
    server, port = await start_load_server(service, "127.0.0.1", 0, credentials)
    address = f"127.0.0.1:{port}"
    request = load_pb2.WatchLoadRequest(router_id="t")

    async def first_report(client_tls: ClientTlsConfig | None) -> load_pb2.LoadReport:
        credentials = channel_credentials(client_tls, "membership.load_stream_tls")
        async with open_channel(address, credentials) as channel:
            stream = load_pb2_grpc.AgentLoadStub(channel).WatchLoad(request, timeout=5)
            async for report in stream:
                return report
        raise AssertionError("stream ended without a report")

    try:
        for refused in (None, ClientTlsConfig(ca_file=str(ca.ca_file))):
            with pytest.raises(grpc.aio.AioRpcError):
                await first_report(refused)  # plaintext, or TLS without a certificate
        mutual = ClientTlsConfig(
            ca_file=str(ca.ca_file), cert_file=str(router_cert), key_file=str(router_key)
        )
        assert (await first_report(mutual)).running == 3
    finally:
        await server.stop(0)
