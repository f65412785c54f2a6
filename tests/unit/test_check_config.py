"""`gpuroute check-config FILE` tells the kind of file by its keys, and says in one line
per problem which file and key are wrong (issue 31: a router file checked as a regions
file printed a wall of pydantic errors)."""

from __future__ import annotations

import pytest
from support.paths import REPO

from gpuroute.cli import main


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("router.example.toml", "router config"),
        ("agent.example.toml", "agent config"),
        ("global.example.toml", "global tier config"),
        ("regions.example.toml", "fleet file"),
        ("fleet.example.toml", "fleet file"),
        ("sim/scenarios/real-fleet.toml", "simulator scenario"),
        ("sim/scenarios/demo.toml", "simulator scenario"),
    ],
)
def test_each_example_file_validates_without_kind(name, kind, capsys) -> None:
    assert main(["check-config", str(REPO / name)]) == 0
    assert capsys.readouterr().out.startswith(f"{REPO / name}: ok ({kind}, ")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('policy = "ours"\n[listen]\nport = 1\n', "(listen, policy) fit router and global equally"),
        ("colour = 1\n", "no kind has its top-level keys (colour)"),
        ("", "it has no top-level keys"),
    ],
)
def test_a_file_of_no_clear_kind_is_an_error_that_says_what_to_do(
    tmp_path, capsys, text, why
) -> None:
    path = tmp_path / "mystery.toml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuroute check-config: error: {path}: cannot tell which kind")
    assert "considered fleet, router, global, agent, scenario" in err and why in err
    assert "--kind {fleet,router,global,agent,scenario}" in err
    assert len(err.splitlines()) == 1


def test_a_bad_key_is_named_with_its_file_in_one_line(tmp_path, capsys) -> None:
    text = (REPO / "router.example.toml").read_text()
    path = tmp_path / "router.toml"
    path.write_text(text.replace("idle_timeout_s = 60.0", "idle_timeout_s = 0"))
    assert main(["check-config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"gpuroute check-config: error: {path}: limits.idle_timeout_s: must be > 0",
        "(checked as a router config, from its top-level keys; if it is another kind, "
        "say so with --kind)",
    ]


def test_an_unknown_key_is_named_not_a_wall(tmp_path, capsys) -> None:
    path = tmp_path / "agent.toml"
    text = (REPO / "agent.example.toml").read_text()
    path.write_text(text.replace("heartbeat_s =", "heartbeat =", 1))
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == f"gpuroute check-config: error: {path}: heartbeat: unknown key"
    assert "agent config" in err


def test_kind_still_overrides(capsys) -> None:
    path = REPO / "router.example.toml"
    assert main(["check-config", "--kind", "regions", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: regions: missing (required)" in err and "checked as" not in err
