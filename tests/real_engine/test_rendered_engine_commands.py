"""The engine command lines as GPU hosts run them: the systemd units Terraform renders into
a host's user data (two TP4 vLLM engines of a p5e, with JSON among their arguments), split as
systemd splits them and parsed by the real vLLM's own parser. With the test that every pool
of fleet.example.toml renders arguments vLLM takes (test_engine_flags_real.py), each engine
command line from fleet file to host is proven."""

from __future__ import annotations

import shlex

import pytest
from gpuroute.fleet.engine_flags import check_engine_args
from support.real_vllm_parser import parse_with_real_vllm
from support.terraform import find_terraform, rendered_templates

pytestmark = pytest.mark.real_engine

VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"


def engine_commands(script: str, image: str) -> list[list[str]]:
    """The arguments after `image` in every engine unit's ExecStart of a user-data script
    (systemd splits ExecStart on whitespace outside quotes, with C escapes, as shlex does
    for these)."""
    commands = []
    for line in script.splitlines():
        if line.startswith("ExecStart=/usr/bin/docker run ") and f" {image} " in line:
            words = shlex.split(line.removeprefix("ExecStart="))
            commands.append(words[words.index(image) + 1 :])
    return commands


def test_every_rendered_vllm_engine_command_parses_with_the_real_vllm(tmp_path) -> None:
    scripts = rendered_templates(find_terraform(), tmp_path)
    commands = engine_commands(scripts["gpu_node"], VLLM_IMAGE)
    assert len(commands) == 2  # one unit per engine of the host
    assert [c[-4:] for c in commands] == [
        ["--host", "0.0.0.0", "--port", "8000"],
        ["--host", "0.0.0.0", "--port", "8001"],
    ]
    assert '{"temperature": 0.5}' in commands[0]  # the JSON argument arrives whole
    public = engine_commands(scripts["gpu_node_public_model"], VLLM_IMAGE)
    assert parse_with_real_vllm(commands + public) == [None] * (len(commands) + len(public))
    for argv in commands + public:
        assert check_engine_args("vllm", "0.32.0", argv, rendered=len(argv)) == []
