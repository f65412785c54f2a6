"""Three regions on loopback (a fake engine and a regional router each, the router streaming
region reports) behind the global tier. Clients are placed with MaxMind's test database
through a trusted proxy's X-Forwarded-For."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time

import aiohttp
import pytest
from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import REGION_HEADER, GlobalApp, GlobalServer
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK, ROUTER_ON_LOOPBACK
from support.live import (
    async_wait_for,
    chat_body,
    counter,
    fake_engines,
    free_ports,
    gpuroute_cmd,
    holds,
    http_ok,
    wait_for,
)
from support.paths import SHARED_DATA

pytestmark = pytest.mark.asyncio
GEOIP = SHARED_DATA / "maxmind-test" / "GeoIP2-City-Test.mmdb"
LONDON, MILTON_US, SWEDEN = "81.2.69.142", "216.160.83.56", "89.160.20.112"
REGIONS = (("us-east", "H100"), ("eu-west", "A100"), ("ap-northeast", "L4"))


def global_toml(routers: dict[str, tuple[str, int]], geoip: bool, **extra: str) -> str:
    lines = [
        'regions_file = "regions.toml"',
        'trusted_proxies = ["127.0.0.1/32"]',
        GLOBAL_ON_LOOPBACK + "tick_s = 0.05",
        f'geoip_database = "{GEOIP}"' if geoip else "",
        "[listen]\nport = 0",
        "[region_health]\nstale_after_s = 1.0\nup_after_s = 2.0",
        '[residency]\ntenants = { acme-eu = ["eu"] }\ncountries = { SE = ["eu"] }',
    ]
    for name, body in extra.items():
        lines.append(f"[{name}]\n{body}")
    for region, (url, port) in routers.items():
        lines.append(
            f'[[endpoints]]\nregion = "{region}"\nurl = "{url}"\nreport = "127.0.0.1:{port}"'
        )
    return "\n".join(lines) + "\n"


class RegionProcess:
    """A region's router as a child process (so an outage can be a SIGKILL)."""

    def __init__(self, tmp_path, region: str, gpu: str, engine_url: str, ports: list[int]) -> None:
        self.region, (self.port, self.report_port) = region, ports
        self.url = f"http://127.0.0.1:{self.port}"
        self.path = tmp_path / f"router-{region}.toml"
        self.path.write_text(
            ROUTER_ON_LOOPBACK
            + f'tick_s = 0.05\n[listen]\nport = {self.port}\n[region]\nname = "{region}"\n'
            f"report_period_s = 0.1\n[region.report_listen]\nport = {self.report_port}\n"
            f'[[backends]]\nurl = "{engine_url}"\ngpu = "{gpu}"\nmodels = ["llama-3.1-8b"]\n'
        )
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(self.path)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: http_ok(self.url + "/healthz"), 20, f"router {self.region}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@contextlib.asynccontextmanager
async def three_regions(tmp_path, repo, geoip: bool = True):
    (tmp_path / "regions.toml").write_text((repo / "regions.example.toml").read_text())
    with fake_engines(*((gpu, 1.0) for _, gpu in REGIONS)) as engines:
        regions: dict[str, RegionProcess] = {}
        ports = free_ports(2 * len(REGIONS))  # all at once: none repeats
        try:
            for i, ((region, gpu), engine) in enumerate(zip(REGIONS, engines, strict=True)):
                mine = ports[2 * i : 2 * i + 2]
                regions[region] = RegionProcess(tmp_path, region, gpu, engine.url, mine)
            (tmp_path / "global.toml").write_text(
                global_toml({r: (p.url, p.report_port) for r, p in regions.items()}, geoip)
            )
            config, fleet, rules = load_global_config(tmp_path / "global.toml")
            app = GlobalApp(config, fleet, rules)
            server = GlobalServer(app)
            await server.start()
            try:
                async with aiohttp.ClientSession() as s:

                    async def all_up() -> bool:
                        return set(await states(s, server.port)) == {"up"}

                    await async_wait_for(all_up, 20, "three regions up")
                    yield f"http://127.0.0.1:{server.port}", app, regions, s
            finally:
                await server.drain(timeout=2.0)
        finally:
            for p in regions.values():
                p.kill()


async def states(session, port: int) -> list[str]:
    async with session.get(f"http://127.0.0.1:{port}/admin/regions") as r:
        return [x["state"] for x in (await r.json())["regions"]]


async def ask(session, url: str, client: str | None = None, **headers: str):
    if client:
        headers["X-Forwarded-For"] = client
    async with session.post(url + "/v1/chat/completions", json=chat_body(), headers=headers) as r:
        body = await r.json()
        return r.status, r.headers.get(REGION_HEADER), body


@pytest.mark.shared_data
async def test_clients_go_to_their_region_and_residency_holds(tmp_path, repo) -> None:
    if not GEOIP.exists():
        pytest.skip(f"{GEOIP} not present (../shared/data is only on the project's machines)")
    async with three_regions(tmp_path, repo) as (url, _app, _regions, s):
        assert (await ask(s, url, LONDON))[:2] == (200, "eu-west")
        assert (await ask(s, url, MILTON_US))[:2] == (200, "us-east")
        # a residency header overrides distance; a Swedish client is bound to the EU
        headers = {"x-gpuroute-residency": "jp"}
        assert (await ask(s, url, MILTON_US, **headers))[:2] == (200, "ap-northeast")
        assert (await ask(s, url, SWEDEN, **{REGION_HEADER: "us-east"}))[:2] == (200, "eu-west")
        # conflicting rules: 403 naming them; a typo: 400
        status, _, body = await ask(s, url, SWEDEN, **{"x-gpuroute-residency": "us"})
        assert status == 403 and body["error"]["code"] == "residency"
        assert "country SE" in body["error"]["message"]
        assert "header us" in body["error"]["message"]
        status, _, body = await ask(s, url, LONDON, **{"x-gpuroute-residency": "mars"})
        assert status == 400 and body["error"]["param"] == "x-gpuroute-residency"
        # a private address is unplaced, not an error
        assert (await ask(s, url, "10.0.0.9"))[0] == 200


async def test_each_refusal_names_its_true_reason(tmp_path, repo) -> None:
    """Issue 45: an unknown model is a 404, a model no allowed region has an engine for is
    503 no_backend, and only a refusal that residency causes is `residency` (403) and moves
    the residency counter, where its alert looks."""
    async with three_regions(tmp_path, repo, geoip=False) as (url, app, regions, s):
        unknown = chat_body() | {"model": "no-such-model"}
        async with s.post(url + "/v1/chat/completions", json=unknown) as r:
            error = (await r.json())["error"]
            assert (r.status, error["code"], error["param"]) == (404, "model_not_found", "model")
        messages = {"model": "no-such-model", "max_tokens": 8, "messages": [{"role": "user",
                    "content": "hi"}]}  # fmt: skip
        async with s.post(url + "/v1/messages", json=messages) as r:
            assert r.status == 404  # in the route's own format
            assert (await r.json())["error"]["type"] == "not_found_error"
        conflicting = {"x-gpuroute-tenant": "acme-eu", "x-gpuroute-residency": "us"}
        status, _, body = await ask(s, url, **conflicting)
        assert (status, body["error"]["code"]) == (403, "residency")
        assert "tenant acme-eu" in body["error"]["message"]
        # eu-west's only engine drained: an EU-bound request has no engine, not a rule
        eu = regions["eu-west"].url
        async with s.get(eu + "/admin/backends") as r:
            (engine,) = (await r.json())["backends"]
        async with s.post(eu + f"/admin/backends/{engine['id']}/drain", json={}) as r:
            assert r.status == 200, await r.text()
        feed = app.feeds.feeds["eu-west"]
        await async_wait_for(holds(lambda: not feed.models), 10, "eu-west serving nothing")
        status, _, body = await ask(s, url, **{"x-gpuroute-residency": "eu"})
        assert (status, body["error"]["code"]) == (503, "no_backend")
        status, served_in, _ = await ask(s, url)
        assert status == 200 and served_in != "eu-west"  # a client with no rule: elsewhere
    chat = "/v1/chat/completions"
    # every answer counted by route, status and the region that answered (none: this tier)
    expected = {("404", "none"): 1, ("403", "none"): 1, ("503", "none"): 1, ("200", served_in): 1}
    for (code, region), count in expected.items():
        seen = counter(app, "gpuroute_global_responses", route=chat, code=code, region=region)
        assert seen == count, (code, region)
    assert (
        app.metrics.registry.get_sample_value(
            "gpuroute_global_request_duration_seconds_count", {"route": chat}
        )
        == 4
    )
    residency = [
        (sample.labels, sample.value)
        for metric in app.metrics.rejections.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    ]
    assert residency == [({"reason": "residency", "rule": "tenant acme-eu + header us"}, 1.0)]
    for reason, count in (("model_not_found", 2), ("residency", 1), ("no_backend", 1)):
        assert counter(app, "gpuroute_global_refusals", reason=reason) == count, reason


async def test_region_outage_moves_traffic_without_failures_or_violations(tmp_path, repo) -> None:
    async with three_regions(tmp_path, repo, geoip=False) as (url, app, regions, s):
        results: list[tuple[float, int, str | None, str]] = []
        stop = asyncio.Event()
        transitions: list[tuple[float, str, str]] = []
        app.feeds.on_change = lambda region, state: transitions.append(
            (time.monotonic(), region, state)
        )

        async def client(kind: str) -> None:
            # "pref" clients prefer eu-west (hint), "eu" clients must stay in the EU
            headers = {REGION_HEADER: "eu-west"}
            if kind == "eu":
                headers["x-gpuroute-residency"] = "eu"
            while not stop.is_set():
                status, region, _ = await ask(s, url, None, **headers)
                results.append((time.monotonic(), status, region, kind))

        tasks = [asyncio.create_task(client(k)) for k in ("pref", "pref", "pref", "eu")]
        await async_wait_for(holds(lambda: len(results) > 20), 10, "traffic")
        down_at = time.monotonic()
        regions["eu-west"].kill()

        def moved() -> float | None:
            after = (t for t, st, r, k in results if t > down_at and k == "pref" and st == 200
                     and r != "eu-west")  # fmt: skip
            return next((t - down_at for t in after), None)

        await async_wait_for(holds(lambda: moved() is not None), 10, "traffic moved")
        await async_wait_for(
            holds(lambda: any(r == "eu-west" and st == "down" for _, r, st in transitions)),
            10, "eu-west down",
        )  # fmt: skip
        await asyncio.sleep(1.0)  # the outage goes on under traffic
        back_at = time.monotonic()
        await asyncio.to_thread(regions["eu-west"].start)

        def returned() -> float | None:
            after = (t for t, st, r, k in results if t > back_at and k == "pref" and r == "eu-west")
            return next((t - back_at for t in after), None)

        await async_wait_for(holds(lambda: returned() is not None), 20, "traffic back")
        await asyncio.sleep(2.0)  # watch for flapping
        stop.set()
        await asyncio.gather(*tasks)
    failed = [r for r in results if r[3] == "pref" and r[1] != 200]
    violations = [r for r in results if r[3] == "eu" and r[1] == 200 and r[2] != "eu-west"]
    eu_refused = [r for r in results if r[3] == "eu" and r[1] == 503]
    eu_states = [st for _, r, st in transitions if r == "eu-west"]
    print(
        f"\nregion outage: traffic moved after {moved():.3f} s, region marked down after "
        f"{next(t for t, r, st in transitions if r == 'eu-west') - down_at:.2f} s; back "
        f"{returned():.2f} s after its router restarted; {len(results)} requests, "
        f"{len(failed)} failed, {len(violations)} residency violations, {len(eu_refused)} "
        f"EU-bound requests refused during the outage; eu-west states {eu_states}"
    )
    assert moved() < 5.0
    assert failed == []
    assert violations == []
    assert eu_refused  # told, never rerouted out of the EU
    assert eu_states == ["down", "recovering", "up"]  # no flapping
