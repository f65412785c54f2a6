"""Router configuration: the example validates, mistakes name the file and the key."""

from __future__ import annotations

import random

import pytest
from gpuroute.router.config.router import RouterConfig, load_router_config
from gpuroute.router.core import RequestInfo
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.slo import STANDARD
from gpuroute.router.http.server import RouterApp
from support.paths import REPO

from gpuroute.cli import main
from gpuroute.config import ConfigError

BACKEND = '[[backends]]\nurl = "http://127.0.0.1:9"\ngpu = "H100"\nmodels = ["m"]\n'


def test_example_config_matches_the_defaults_and_builds_a_router() -> None:
    config = load_router_config(REPO / "router.example.toml")
    defaults = RouterConfig(backends=config.backends)
    assert config.model_dump() == defaults.model_dump()  # the example documents the defaults
    router = RouterApp(config)
    capacities = {b.gpu_type: b.capacity for b in router.scheduler.backends}
    assert capacities["H100"] == 1.0 > capacities["A100"] > capacities["L4"] > 0


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ('policy = "fastest"\n' + BACKEND, "policy", "unknown policy 'fastest'"),
        (BACKEND.replace("H100", "Z900"), "backends[0].gpu", "unknown GPU type 'Z900'"),
        (BACKEND.replace("http://127.0.0.1:9", "127.0.0.1:9"), "backends[0].url", "http(s)://"),
        (BACKEND + BACKEND, "backends", "duplicate backend id '127.0.0.1:9'"),
        ("[retry]\nbudget_ratio = 2\n" + BACKEND, "retry.budget_ratio", "must be <= 1"),
        ('[admission]\ndefault_priority = "vip"\n' + BACKEND, "admission", "unknown priority"),
        ("[limits]\nmax_body = 1\n" + BACKEND, "limits.max_body", "unknown key"),
        ("[workers]\ncount = 0\n" + BACKEND, "workers.count", "1 to 256"),
        (
            "admin_on_public_listener = true\n[workers]\ncount = 2\n" + BACKEND,
            "workers.count",
            "need admin_listen",
        ),
        ("[slo]\ngpu_prices = { B300 = 3.0 }\n" + BACKEND, "slo.gpu_prices", "unknown GPU type"),
        ('[slo]\ndefault_class = "gold"\n' + BACKEND, "slo", "default_class 'gold'"),
        ("[slo]\nprior_scale = 0\n" + BACKEND, "slo.prior_scale", "must be > 0"),
        ("[rebalance]\nenabled = true\n" + BACKEND, "rebalance", "does not move streams yet"),
        ("", "(top level)", "list [[backends]] or set membership.consul"),
        (
            '[membership]\nconsul = "http://127.0.0.1:8500"\nwait_s = 0\n',
            "membership.wait_s",
            "must be >= 1",
        ),
    ],
)
def test_bad_config_names_file_and_key(tmp_path, text, key, message) -> None:
    path = tmp_path / "router.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_router_config(path)
    assert str(path) in str(err.value) and key in str(err.value) and message in str(err.value)


def test_router_cli_reports_each_config_error_with_file_and_key(tmp_path, capsys) -> None:
    path = tmp_path / "router.toml"
    path.write_text("policy = 3\n")
    assert main(["router", "--config", str(path)]) == 2
    lines = capsys.readouterr().err.strip().removeprefix("gpuroute router: error: ").splitlines()
    assert lines == [
        f"{path}: policy: Input should be a valid string",
    ]


def test_a_key_priority_must_be_a_known_class(tmp_path) -> None:
    digest = "a" * 64
    path = tmp_path / "router.toml"
    path.write_text(
        BACKEND + f'[[auth.keys]]\nsha256 = "{digest}"\ntenant = "t"\npriority = "vip"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_router_config(path)
    assert "auth.keys[0].priority: unknown priority 'vip'" in str(err.value)


def test_max_tokens_is_output_turns_on_the_stall_guard(tmp_path) -> None:
    """Off by default (max_tokens is usually a cap); on, a stream's max_tokens is its
    length, so it gets a stall allowance in the latency model."""

    for flag, protected in (("false", 0), ("true", 1)):
        path = tmp_path / f"{flag}.toml"
        path.write_text(f"[slo]\nmax_tokens_is_output = {flag}\n" + BACKEND)
        scheduler = RouterApp(load_router_config(path)).scheduler
        request = RequestLifetime(RequestInfo(1, "m", 100, 8, slo=STANDARD, arrived_at=0.0))
        assert scheduler.route(request, 0.0, random.Random(1)) is not None
        assert scheduler.latency.protected_streams == protected
