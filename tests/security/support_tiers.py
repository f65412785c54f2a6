"""Two regions behind the global tier, all in this process: a router per region (eu-west in
the eu jurisdiction, us-east in the us), each in front of an engine that records what
reached it, so a test sees where every request was served and with which headers."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from support.global_tier import global_over
from support.live import router_server, scripted_backend
from support_security import RecordingEngine, secure_toml

from gpuroute.auth import key_digest

KEY, EU_KEY = "sk-tiers-acme", "sk-tiers-acme-eu"
DECISION_KEY = "shared-between-the-tiers"
JURISDICTION = {"eu-west": "eu", "us-east": "us"}


def global_residency(*, decision_key: bool = True, top: str = "", residency: str = "") -> str:
    """The global tier's residency: acme-eu's key may be served in the eu only. `top`:
    top-level keys; `residency`: more lines of the [residency] section."""
    keys = f'"{key_digest(KEY)}" = "acme", "{key_digest(EU_KEY)}" = "acme-eu"'
    lines = [
        top,
        "[residency]",
        'tenants = { acme-eu = ["eu"] }',
        f"api_keys = {{ {keys} }}",
        f'decision_key = "{DECISION_KEY}"' if decision_key else "",
        residency,
    ]
    return "\n".join(lines) + "\n"


def router_sections(region: str, *, decision_key: bool = True, top: str = "") -> str:
    """A router that knows both keys but holds no residency rule of its own for either
    (the global tier's decision is what keeps acme-eu in the eu)."""
    keys = "".join(
        f'[[auth.keys]]\nsha256 = "{key_digest(k)}"\ntenant = "{t}"\n'
        for k, t in ((KEY, "acme"), (EU_KEY, "acme-eu"))
    )
    region_lines = f'name = "{region}"\njurisdiction = "{JURISDICTION[region]}"\n'
    if decision_key:
        region_lines += f'decision_key = "{DECISION_KEY}"\nrequire_global_decision = true\n'
    return top + "\n" + f"[region]\n{region_lines}{keys}"


@dataclass
class Tiers:
    url: str  # the global tier
    app: object  # its GlobalApp
    routers: dict[str, object]  # region -> RouterServer
    engines: dict[str, RecordingEngine]  # region -> what reached its engine

    def served_in(self) -> dict[str, int]:
        return {region: len(engine.seen) for region, engine in self.engines.items()}


@contextlib.asynccontextmanager
async def two_regions(
    tmp_path,
    *,
    decision_key: bool = True,
    global_top: str = "",
    residency: str = "",
    router_top: str = "",
):
    engines = {region: RecordingEngine() for region in JURISDICTION}
    async with contextlib.AsyncExitStack() as stack:
        routers, urls = {}, {}
        for region, engine in engines.items():
            engine_url = await stack.enter_async_context(scripted_backend(engine))
            sections = router_sections(region, decision_key=decision_key, top=router_top)
            text = secure_toml(engine_url, top=sections)
            folder = tmp_path / region
            folder.mkdir()
            server = await stack.enter_async_context(router_server(text, folder))
            routers[region], urls[region] = server, f"http://127.0.0.1:{server.port}"
        text = global_residency(decision_key=decision_key, top=global_top, residency=residency)
        url, app = await stack.enter_async_context(global_over(tmp_path, urls, text))
        yield Tiers(url, app, routers, engines)
