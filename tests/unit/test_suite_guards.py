"""The suite's own guards against flakes and silent gaps on shared 2-core machines."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, settings
from support.live import async_wait_for
from support.paths import REPO

pytest_plugins = ["pytester"]


def test_property_tests_have_no_per_example_deadline() -> None:
    """tests/conftest.py's profile: hypothesis' 200 ms default fails a stalled machine."""
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check


def test_every_test_has_a_ceiling(pytestconfig, request) -> None:
    assert pytestconfig.getini("timeout") == "300"
    assert request.node.get_closest_marker("timeout") is None  # the ini's 300 s applies


@pytest.mark.real_engine
def test_slow_and_real_engine_tests_get_900_s(request) -> None:
    assert request.node.get_closest_marker("timeout").args == (900,)


@pytest.mark.asyncio
async def test_async_wait_for_bounds_a_check_that_hangs() -> None:
    async def hangs() -> bool:
        await asyncio.Event().wait()
        return True

    with pytest.raises(AssertionError) as failed:
        await asyncio.wait_for(async_wait_for(hangs, 0.2, "a hung check"), 10)
    assert str(failed.value) == "timed out after 0.2 s waiting for a hung check"


@pytest.mark.asyncio
async def test_async_wait_for_passes_on_a_checks_own_timeout() -> None:
    async def times_out() -> bool:
        raise TimeoutError("the check's own client gave up")

    with pytest.raises(TimeoutError) as raised:
        await async_wait_for(times_out, 10, "never")
    assert str(raised.value) == "the check's own client gave up"


def test_a_missing_component_fails_under_make_test_and_skips_elsewhere(monkeypatch) -> None:
    from support import components

    monkeypatch.setenv("GPUROUTE_REQUIRE_COMPONENTS", "1")
    with pytest.raises(pytest.fail.Exception) as failed:
        components.missing("run `make consul`")
    assert str(failed.value) == (
        "run `make consul` (GPUROUTE_REQUIRE_COMPONENTS is set: `make test` installs it)"
    )
    for unset in ("0", ""):
        monkeypatch.setenv("GPUROUTE_REQUIRE_COMPONENTS", unset)
        with pytest.raises(pytest.skip.Exception) as skipped:
            components.missing("run `make consul`")
        assert str(skipped.value) == "run `make consul`"


def test_make_test_requires_the_components_it_installs(repo) -> None:
    """The Makefile's test target installs them, then runs pytest with the promise set, its
    tests spread over xdist's workers by group (the real-engine tests on one)."""
    makefile = (repo / "Makefile").read_text()
    target = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    head, *recipe = target.splitlines()
    assert set(head.split()) >= {"bench-deps", "consul", "terraform", "vllm", "peer-routers"}
    run = "\tGPUROUTE_REQUIRE_COMPONENTS=1 $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup"
    assert run in recipe


MISSING = """
from support import components

def test_needs_consul():
    components.missing("run `make consul`")
"""


def test_the_summary_names_each_skipped_test_and_why(pytester, monkeypatch) -> None:
    """tests/conftest.py's report hook: a skip raised in a helper is listed at the test."""
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.syspathinsert(REPO / "tests")
    pytester.makepyfile(test_component=MISSING)
    monkeypatch.delenv("GPUROUTE_REQUIRE_COMPONENTS", raising=False)
    skipped = pytester.runpytest("-ra", "-p", "no:cacheprovider")
    skipped.assert_outcomes(skipped=1)
    skipped.stdout.fnmatch_lines(
        ["SKIPPED [[]1[]] test_component.py:3: test_needs_consul: run `make consul`"]
    )
    monkeypatch.setenv("GPUROUTE_REQUIRE_COMPONENTS", "1")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(failed=1)


def test_no_two_test_modules_share_a_basename() -> None:
    """The test folders are not packages: pytest imports each module by its basename, and
    a second module of the same name stops the whole run at collection."""
    names = [p.name for p in (REPO / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


@pytest.mark.real_engine
def test_the_real_engine_tests_run_on_one_xdist_worker(request) -> None:
    """tests/conftest.py's group: `make test`'s loadgroup runs one real vLLM at a time."""
    assert request.node.get_closest_marker("xdist_group").args == ("real_engine",)


@pytest.fixture(scope="module")
def module_wide() -> str:
    return "started once per module"


def test_a_module_fixture_keeps_its_tests_on_one_worker(request, module_wide) -> None:
    module = request.node.nodeid.split("::")[0]  # tests/unit/test_suite_guards.py
    assert request.node.get_closest_marker("xdist_group").args == (module,)


def test_other_tests_go_to_any_worker(request) -> None:
    assert request.node.get_closest_marker("xdist_group") is None
