"""Model routes (router/core/model_routes.py): a canary's sticky weighted split, its rollout
and rollback, aliases and fallback chains. Sessions are hashed as the router keeps them
(request_parse.session_key), so what holds here holds for clients' `x-session-id`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpuroute.global_.core.region_health import region_failed
from gpuroute.router.config.models import model_routes
from gpuroute.router.config.router import load_router_config
from gpuroute.router.core.backend import Backend, BackendState
from gpuroute.router.core.model_routes import (
    ModelChoice,
    ModelRoute,
    ModelRouteError,
    ModelRoutes,
    check_split,
    split_bucket,
)
from gpuroute.router.core.region_summary import summarise
from gpuroute.router.front.parse import session_key
from hypothesis import given
from hypothesis import strategies as st

V1, V2 = "m@v1", "m@v2"
SESSIONS = [session_key(f"user-{i}") for i in range(10_000)]
ROUTER = """admin_on_public_listener = true
[[backends]]
url = "http://127.0.0.1:9"
gpu = "H100"
models = ["m@v1", "m@v2", "light"]
[[models]]
name = "m"
aliases = ["chat", "latest"]
split = {{"m@v1" = {v1}, "m@v2" = {v2}}}
fallback = ["light"]
[[models]]
name = "light"
"""


def canary(v2: float) -> ModelRoutes:
    return ModelRoutes([ModelRoute("m", ((V1, 100 - v2), (V2, v2)), ("light",))])


def on(routes: ModelRoutes, version: str, sessions: list[str] = SESSIONS) -> set[str]:
    """The sessions `routes` sends to `version` of m."""
    return {s for s in sessions if routes.resolve("m", s).model == version}


def routes_from_file(tmp_path: Path, v2: int, name: str = "router.toml") -> ModelRoutes:
    path = tmp_path / name
    path.write_text(ROUTER.format(v1=100 - v2, v2=v2))
    return model_routes(load_router_config(path).models)


# -- the split ---------------------------------------------------------------------------
def test_a_95_5_split_sends_5_percent_of_sessions_to_the_canary() -> None:
    share = len(on(canary(5), V2)) / len(SESSIONS)
    assert abs(share - 0.05) <= 0.01, share
    assert len(on(canary(5), V1)) + len(on(canary(5), V2)) == len(SESSIONS)


def test_a_session_always_gets_the_same_version() -> None:
    routes = canary(5)
    first = {s: routes.resolve("m", s).model for s in SESSIONS}
    for _ in range(3):
        assert {s: routes.resolve("m", s).model for s in SESSIONS} == first


def test_two_routers_built_from_one_file_agree_on_every_session(tmp_path: Path) -> None:
    """A restart, or another replica: same file, same version for every session."""
    one, other = routes_from_file(tmp_path, 5), routes_from_file(tmp_path, 5, "replica.toml")
    assert one is not other
    assert all(one.resolve("m", s).model == other.resolve("m", s).model for s in SESSIONS)
    assert on(one, V2) == on(canary(5), V2)


def test_raising_the_canary_keeps_every_session_it_had() -> None:
    before, after = on(canary(5), V2), on(canary(10), V2)
    assert before < after  # strictly more, none lost
    assert abs(len(after) / len(SESSIONS) - 0.10) <= 0.01
    # the sessions that moved came from v1, and only those whose bucket changed hands
    assert after - before <= on(canary(5), V1)


def test_rollback_sends_no_session_to_the_canary() -> None:
    routes = canary(5)
    assert on(routes, V2)
    routes.set_split("m", [(V1, 100), (V2, 0)])
    assert on(routes, V2) == set()
    assert on(routes, V1) == set(SESSIONS)
    assert routes.routes["m"].fallback == ("light",)  # weights change, nothing else


def test_set_split_moves_sessions_exactly_as_a_fresh_table_would() -> None:
    routes = canary(5)
    routes.set_split("m", [(V1, 90), (V2, 10)])
    assert on(routes, V2) == on(canary(10), V2)


@given(st.integers(0, 100), st.integers(0, 100))
def test_more_weight_on_a_version_never_takes_a_session_from_it(a: int, b: int) -> None:
    low, high = sorted((a, b))
    sample = SESSIONS[:500]
    assert on(canary(low), V2, sample) <= on(canary(high), V2, sample)
    assert on(canary(high), V1, sample) <= on(canary(low), V1, sample)


@given(st.floats(0, 1, exclude_max=True))
def test_every_bucket_gets_a_live_version(bucket: float) -> None:
    route = ModelRoute("m", ((V1, 100.0), (V2, 0.0)))
    assert route.version(bucket) == V1
    assert ModelRoute("m", ((V1, 0.0), (V2, 100.0))).version(bucket) == V2
    assert ModelRoute("m").version(bucket) == "m"


# -- aliases and fallbacks ---------------------------------------------------------------
def test_aliases_resolve_to_the_model_and_its_split() -> None:
    routes = ModelRoutes(canary(5).routes.values(), {"chat": "m", "latest": "chat"})
    session = SESSIONS[0]
    version = routes.resolve("m", session).model
    assert routes.resolve("latest", session) == ModelChoice("latest", "m", (version, "light"))
    assert routes.resolve("chat", session, fallback=False) == ModelChoice("chat", "m", (version,))
    assert routes.resolve("other", session) == ModelChoice("other", "other", ("other",))
    assert routes.names() == {"chat", "latest", "m"}


@pytest.mark.parametrize(
    ("aliases", "loop"),
    [
        ({"a": "a"}, "a → a"),
        ({"a": "b", "b": "a"}, "a → b → a"),
        ({"x": "a", "a": "b", "b": "c", "c": "a"}, "x → a → b → c → a"),
    ],
)
def test_an_alias_loop_raises_naming_the_loop(aliases: dict[str, str], loop: str) -> None:
    with pytest.raises(ModelRouteError, match=f"^alias loop: {re.escape(loop)}$"):
        ModelRoutes([], aliases)


def test_a_fallbacks_own_split_is_drawn_for_the_same_session() -> None:
    light = ModelRoute("light", (("light@a", 50), ("light@b", 50)))
    heavy = ModelRoute("heavy", (), ("light", "heavy"))  # a cycle back to itself is skipped
    routes = ModelRoutes([heavy, light])
    for session in SESSIONS[:200]:
        chain = routes.resolve("heavy", session).chain
        assert chain == ("heavy", light.version(split_bucket("light", session)))
    drawn = {routes.resolve("heavy", s).fallbacks for s in SESSIONS[:200]}
    assert drawn == {("light@a",), ("light@b",)}


# -- bad splits ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("split", "message"),
    [
        ([(V1, 90), (V2, 5)], "model 'm': split weights add up to 95, not 100"),
        ([(V1, 110), (V2, -10)], "model 'm': split weights must be >= 0"),
        ([(V1, 50), (V1, 50)], "model 'm': a version appears twice in its split"),
    ],
)
def test_bad_weights_are_refused(split: list[tuple[str, float]], message: str) -> None:
    with pytest.raises(ModelRouteError, match=f"^{re.escape(message)}$"):
        check_split("m", split)
    routes = canary(5)
    with pytest.raises(ModelRouteError, match=f"^{re.escape(message)}$"):
        routes.set_split("m", split)
    assert routes.routes["m"].split == ((V1, 95), (V2, 5))  # left as it was


def test_set_split_knows_only_the_routes_versions() -> None:
    routes = canary(5)
    with pytest.raises(ModelRouteError, match=r"^model 'm': \['m@v3'\] are not among"):
        routes.set_split("m", [(V1, 90), ("m@v3", 10)])
    with pytest.raises(ModelRouteError, match=r"^model 'light' has no route to split$"):
        routes.set_split("light", [("light", 100)])


# -- what a region advertises ----------------------------------------------------------------
def test_a_region_advertises_the_names_its_models_answer() -> None:
    routes = ModelRoutes(
        [ModelRoute("m", ((V1, 95), (V2, 5)), ("lite",)), ModelRoute("light")],
        {"chat": "m", "lite": "light"},
    )
    assert routes.reachable({V2}) == {"m", "chat"}
    assert routes.reachable({"light"}) == {"m", "chat", "light", "lite"}  # m by its fallback
    assert routes.reachable({"other"}) == frozenset()
    routes.set_split("m", [(V1, 100), (V2, 0)])
    assert routes.reachable({V2}) == frozenset()  # rolled back: v2 answers no request for m


def test_the_region_summary_lists_served_models_and_the_names_they_answer() -> None:
    routes = ModelRoutes([ModelRoute("m", ((V1, 95), (V2, 5)))], {"chat": "m"})
    up = [Backend("b1", "H100", (V2,)), Backend("b2", "H100", ("other",))]
    assert summarise(up, 2.0, routes=routes).models == ("chat", "m", V2, "other")
    assert summarise(up, 2.0).models == (V2, "other")  # no routes: the served names alone
    up[0].state = BackendState.EJECTED
    summary = summarise(up, 2.0, routes=routes)
    assert summary.models == ("other",)
    # what the global tier tells a model no engine serves now from one nobody has
    assert summary.known == ("chat", "m", V2, "other")
    up[1].state = BackendState.DRAINING
    assert summarise(up, 2.0, routes=routes).known == ("chat", "m", V2, "other")


def test_a_routers_refusal_of_one_model_does_not_count_against_its_region() -> None:
    refusal = b'{"error": {"message": "m", "type": "service_unavailable", "code": "no_backend"}}'
    assert not region_failed(503, refusal)
    assert region_failed(503, b'{"error": {"code": "draining"}}')
    assert region_failed(503, b"<html>bad gateway</html>")
    assert region_failed(502, refusal)
    assert region_failed(500, b"")


def test_a_keys_model_list_covers_aliases_and_versions_never_fallbacks() -> None:
    """Issue 42 finding 7: an entry stands for the model it names after aliases and for
    that model's split versions; a fallback is not covered by the model falling back."""
    routes = ModelRoutes(
        [
            ModelRoute("cheap", fallback=("big",)),
            ModelRoute("m", split=(("m@v1", 50.0), ("m@v2", 50.0))),
        ],
        aliases={"cheap-latest": "cheap", "sneaky": "big"},
    )
    assert all(routes.permits(None, m) for m in ("big", "anything"))
    by_alias = frozenset({"cheap-latest"})
    assert routes.permits(by_alias, "cheap") and routes.permits(by_alias, "cheap-latest")
    assert not routes.permits(by_alias, "big") and not routes.permits(by_alias, "sneaky")
    whole = frozenset({"m"})
    assert routes.permits(whole, "m@v1") and routes.permits(whole, "m@v2")
    one = frozenset({"m@v1"})
    assert routes.permits(one, "m@v1") and not routes.permits(one, "m@v2")
    assert not routes.permits(one, "m")
    # before a session is known (a Responses follow-up, before its conversation is read):
    # refused only where no session's version is allowed
    assert routes.may_serve(one, "m") and routes.may_serve(whole, "m")
    assert routes.may_serve(by_alias, "cheap-latest") and routes.may_serve(None, "big")
    assert not routes.may_serve(by_alias, "sneaky") and not routes.may_serve(one, "cheap")
