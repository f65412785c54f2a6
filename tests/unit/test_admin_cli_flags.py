"""`gpuroute admin`'s flags send what the admin API takes: every field of a backend and of
an API key has its flag (a field added to the config cannot be missed here)."""

from __future__ import annotations

import pytest
from gpuroute.router.config.auth import ApiKeyConfig
from gpuroute.router.config.router import BackendConfig

from gpuroute.auth import key_digest
from gpuroute.cli import build_parser


def test_backends_add_has_a_flag_for_every_backend_field() -> None:
    args = build_parser().parse_args(
        ["admin", "backends", "add", "--url", "http://e:8000", "--gpu", "L4", "--models", "m"]
    )
    assert set(args.fields) == set(BackendConfig.model_fields)
    assert args.request(args) == (
        "POST", "/admin/backends", {"url": "http://e:8000", "gpu": "L4", "models": ["m"]},
    )  # fmt: skip


def test_keys_add_has_a_flag_for_every_key_field_and_sends_only_the_digest(tmp_path) -> None:
    (tmp_path / "key").write_text("sk-secret\n")
    args = build_parser().parse_args(
        ["admin", "keys", "add", "--key-file", str(tmp_path / "key"), "--tenant", "t",
         "--max-in-flight", "4"]
    )  # fmt: skip
    assert {*args.fields, "sha256"} == set(ApiKeyConfig.model_fields)
    method, path, body = args.request(args)
    assert (method, path) == ("POST", "/admin/keys")
    assert body == {"sha256": key_digest("sk-secret"), "tenant": "t", "max_in_flight": 4}


@pytest.mark.parametrize("weight", ["m@v1", "=50", "m@v1=half"])
def test_a_split_weight_is_version_equals_percent(weight: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["admin", "splits", "set", "m", weight])
    assert "expected VERSION=PERCENT" in capsys.readouterr().err
