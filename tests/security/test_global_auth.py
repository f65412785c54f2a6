"""The global tier reads keys exactly as routers do (issue 16 item 3): an EU-only key sent
as `bearer ...` in lowercase used to be served in us-east."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request
from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import GlobalApp
from support.paths import REPO

from gpuroute.auth import AuthError, bearer, key_digest
from gpuroute.headers import interpreted
from gpuroute.openai_api import Rejection

EU_KEY = "sk-acme-eu"


def global_app(tmp_path, *, allow_anonymous: bool = False) -> GlobalApp:
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    (tmp_path / "global.toml").write_text(
        'regions_file = "regions.toml"\n'
        '[[endpoints]]\nregion = "eu-west"\nurl = "http://127.0.0.1:1"\nreport = "127.0.0.1:2"\n'
        '[[endpoints]]\nregion = "us-east"\nurl = "http://127.0.0.1:3"\nreport = "127.0.0.1:4"\n'
        f"[residency]\nallow_anonymous = {str(allow_anonymous).lower()}\n"
        'tenants = { acme-eu = ["eu"] }\n'
        f'api_keys = {{ "{key_digest(EU_KEY)}" = "acme-eu" }}\n'
    )
    return GlobalApp(*load_global_config(tmp_path / "global.toml"))


def tenant_of(app: GlobalApp, headers: dict[str, str] | None = None) -> str | None:
    request = make_mocked_request("POST", "/v1/chat/completions", headers=headers or {})
    return app.tenant(interpreted(request.headers.items()), request.remote)


@pytest.mark.parametrize(
    "header",
    [f"Bearer {EU_KEY}", f"bearer {EU_KEY}", f"BEARER {EU_KEY}", f"  Bearer   {EU_KEY} "],
)
def test_every_spelling_of_the_scheme_finds_the_tenant(tmp_path, header: str) -> None:
    app = global_app(tmp_path)
    assert tenant_of(app, {"Authorization": header}) == "acme-eu"
    allowed = app.rules.allowed(tenant=tenant_of(app, {"Authorization": header}))
    assert allowed.permits("eu") and not allowed.permits("us")


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer"}]
)
def test_no_readable_key_fails_closed(tmp_path, headers: dict) -> None:
    app = global_app(tmp_path)
    with pytest.raises(Rejection) as refused:
        tenant_of(app, headers)
    assert refused.value.status == 401


def test_anonymous_only_when_explicitly_allowed(tmp_path) -> None:
    app = global_app(tmp_path, allow_anonymous=True)
    assert tenant_of(app) is None


def test_both_tiers_share_one_parser() -> None:
    from gpuroute.router import quotas

    assert quotas.bearer is bearer
    with pytest.raises(AuthError) as bad:
        bearer("Bearer \udcff\udcfe")  # non-UTF-8 bytes as aiohttp decodes them
    assert bad.value.status == 400
