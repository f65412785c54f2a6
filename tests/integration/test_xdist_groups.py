"""`make test`'s xdist groups hold (tests/conftest.py): the real-engine tests on one worker,
a module's shared fixture on one worker. pytest 9.2 with pytest-xdist 3.8 drops the groups
without a word (pytest-xdist#1386; hence the pin in pyproject.toml): this run would show it.
It starts xdist's worker processes, so it is not a unit test."""

from __future__ import annotations

import re

from support.paths import REPO

pytest_plugins = ["pytester"]

SUITE = """
import os
import pytest

@pytest.fixture(scope="module")
def shared():
    # one line each time the fixture starts, on whichever worker starts it
    with open(STARTS, "a") as starts:
        starts.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.real_engine
@pytest.mark.parametrize("i", range(6))
def test_engine(i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_shared(i, shared):
    pass

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


def test_grouped_tests_share_a_worker(pytester) -> None:
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makeini(
        f"[pytest]\npythonpath = {REPO / 'tests'}\nasyncio_default_fixture_loop_scope = function\n"
    )
    starts = pytester.path / "shared_starts.txt"
    pytester.makepyfile(test_grouped=f"STARTS = {str(starts)!r}\n" + SUITE)
    run = pytester.runpytest("-n", "3", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider")
    run.assert_outcomes(passed=18)
    ran = re.findall(r"\[(gw\d+)\] .*PASSED test_grouped\.py::(test_\w+)\[\d\]", run.stdout.str())
    workers = {test: {w for w, t in ran if t == test} for test in ("test_engine", "test_shared")}
    assert len(ran) == 18
    # the module's fixture started once (one line), on the worker that ran its group
    started_on = starts.read_text().splitlines()
    assert len(started_on) == 1 and set(started_on) == workers["test_shared"], started_on
    assert len(workers["test_engine"]) == 1 and len(workers["test_shared"]) == 1, workers
