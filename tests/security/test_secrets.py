"""Secrets outside the TOML (issue 16 item 18): file and environment forms, one form per
secret, and a configured Consul token that CONSUL_HTTP_TOKEN cannot silently replace."""

from __future__ import annotations

import pytest
from gpuroute.router.config.router import RouterConfig

from gpuroute.config import ConfigError
from gpuroute.consul_client import ConsulClient
from gpuroute.secrets import read_secret

BACKEND = {"backends": [{"url": "http://127.0.0.1:1", "gpu": "H100", "models": ["m"]}]}


def test_file_and_environment_forms(tmp_path, monkeypatch) -> None:
    token = tmp_path / "token"
    token.write_text("from-file\n")
    config = RouterConfig.model_validate({**BACKEND, "membership": {"token_file": str(token)}})
    assert read_secret(config.membership, "token", "membership") == "from-file"
    monkeypatch.setenv("MY_TOKEN", "from-env")
    config = RouterConfig.model_validate({**BACKEND, "membership": {"token_env": "MY_TOKEN"}})
    assert read_secret(config.membership, "token", "membership") == "from-env"


def test_one_form_per_secret_and_clear_errors(tmp_path, monkeypatch) -> None:
    with pytest.raises(ValueError, match="token and token_file: set only one form"):
        RouterConfig.model_validate({**BACKEND, "membership": {"token": "x", "token_file": "/x"}})
    config = RouterConfig.model_validate(
        {**BACKEND, "membership": {"token_file": str(tmp_path / "missing")}}
    )
    with pytest.raises(ConfigError, match=r"membership\.token_file: cannot read"):
        read_secret(config.membership, "token", "membership")
    monkeypatch.delenv("UNSET_TOKEN", raising=False)
    config = RouterConfig.model_validate({**BACKEND, "membership": {"token_env": "UNSET_TOKEN"}})
    with pytest.raises(ConfigError, match="UNSET_TOKEN is not set"):
        read_secret(config.membership, "token", "membership")


@pytest.mark.asyncio
async def test_configured_consul_token_wins_over_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "from-environment")
    client = ConsulClient("http://127.0.0.1:8500", token="configured")
    assert client.api.token == "configured"
    await client.close()
    fallback = ConsulClient("http://127.0.0.1:8500")
    assert fallback.api.token == "from-environment"  # the documented fallback
    await fallback.close()
