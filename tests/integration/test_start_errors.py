"""A process the benchmarks and demos start that dies while starting says why (issue 45:
`bench live` once stopped with "engine-4-T4 exited with status 1 while starting" and
nothing else)."""

from __future__ import annotations

import sys

import pytest
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import StartError, spawn, wait_http

DIES = "import sys; print('starting'); print('no GPU type named Z9', file=sys.stderr); sys.exit(3)"


def test_a_child_that_dies_while_starting_is_named_with_its_log(tmp_path) -> None:
    port = free_port()
    child = spawn("engine-4-T4", [sys.executable, "-c", DIES], tmp_path, port)
    with pytest.raises(StartError) as failed:
        wait_http(f"http://127.0.0.1:{port}/health", 30, child, "engine-4-T4")
    message = str(failed.value)
    assert message.startswith("engine-4-T4 exited with status 3 while starting")
    assert "no GPU type named Z9" in message and str(child.log) in message


def test_a_child_with_an_empty_log_is_named_alone(tmp_path) -> None:
    port = free_port()
    child = spawn("quiet", [sys.executable, "-c", "raise SystemExit(1)"], tmp_path, port)
    with pytest.raises(StartError, match=r"^quiet exited with status 1 while starting$"):
        wait_http(f"http://127.0.0.1:{port}/health", 30, child, "quiet")
