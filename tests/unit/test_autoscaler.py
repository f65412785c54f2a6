"""The router's autoscale shell (router/scaling/autoscaler.py): what it feeds the sizer, the
region's rate it sizes with where peers share theirs, and what it shows."""

from __future__ import annotations

import math

import msgpack
import pytest
from gpuroute.router.backends.assemble import build_scheduler, prior_book
from gpuroute.router.config.router import RouterConfig
from gpuroute.router.core.backend import BackendState
from gpuroute.router.observe.metrics import PoolCollector
from gpuroute.router.scaling.autoscaler import Autoscaler
from gpuroute.router.shared.load import ARRIVALS_KEY, decode_share, merge_arrivals
from prometheus_client import CollectorRegistry

MODEL = "llama-3.1-8b"


def router_config(**autoscale) -> RouterConfig:
    backends = [
        {"url": f"http://10.0.0.{i}:8000", "gpu": "H100", "models": [MODEL]} for i in (1, 2)
    ]
    section = {"capacity_rps": {MODEL: 1.0}, "lead_time_s": 0, "rate_window_s": 1.0,
               "standby_backends": 0} | autoscale  # fmt: skip
    slo = {"default_class": "a", "classes": [
        {"name": "a", "ttft_s": 2.0, "tpot_s": 0.1}, {"name": "b", "ttft_s": 9, "tpot_s": 0.04},
    ]}  # fmt: skip
    return RouterConfig.model_validate({"backends": backends, "autoscale": section, "slo": slo})


class Wall:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def autoscaler(**autoscale) -> tuple[Autoscaler, Wall]:
    config = router_config(**autoscale)
    wall = Wall()
    scheduler = build_scheduler(config, prior_book(config))
    return Autoscaler(config.autoscale, scheduler, config.slo, wall=wall), wall


def test_the_region_rate_is_our_own_plus_the_peers_and_sizes_every_replica_alike() -> None:
    ours, wall = autoscaler()
    assert ours.sizer.tpot_s == 0.04  # the tightest class's TPOT
    ours.tick()  # the rate's clock starts
    for _ in range(8):
        ours.arrived(MODEL)
    wall.now += 2.0
    alone = ours.tick()[MODEL]
    own = ours.rates.own[MODEL]
    assert own == alone.rate_rps == pytest.approx(4.0)  # the first interval primes it
    assert alone.active == math.ceil(own / 0.8)  # capacity 1 rps at the high mark
    ours.rates.peers = {MODEL: 3.0, "another-model": 9.0}  # a peer's pool not served here
    wall.now += 1e-9  # no new arrivals to speak of: our own rate stays
    shared = ours.tick()[MODEL]
    assert shared.rate_rps == pytest.approx(own + 3.0)
    assert shared.active == math.ceil((own + 3.0) / 0.8)
    assert sorted(ours.sizes) == [MODEL]
    assert ours.rates.own[MODEL] == pytest.approx(own)  # what it shares: its own rate alone


def test_admin_autoscale_schema_and_the_metrics_it_shows() -> None:
    ours, _wall = autoscaler()
    backends = ours.sizer.scheduler.backends
    standby = backends.get("10.0.0.2:8000")
    backends.set_state(standby, BackendState.STANDBY, 0.0, "consul: standby")
    ours.held(MODEL)  # a hold: the pool grows by one whatever the rate says
    ours.tick()
    assert ours.describe() == {
        "interval_s": 15.0,
        "pools": {
            MODEL: {
                "desired_backends": 2, "desired_standby_backends": 0, "in_rotation": 1,
                "standby": 1, "rate_rps": 0.0, "forecast_rps": 0.0, "utilisation": 0.0,
                "capacity_rps": 1.0, "reason": "requests held by the SLO gate",
            }
        },
    }  # fmt: skip
    assert ours.standby.promote(MODEL, 5.0) is standby
    registry = CollectorRegistry()
    registry.register(PoolCollector(ours))
    sample = registry.get_sample_value
    assert sample("gpuroute_pool_desired_backends", {"pool": MODEL}) == 2
    assert sample("gpuroute_pool_backend_capacity_rps", {"pool": MODEL}) == 1.0
    assert sample("gpuroute_standby_promotions_total", {"pool": MODEL}) == 1
    off, _ = autoscaler(enabled=False)
    off.tick()
    registry = CollectorRegistry()
    registry.register(PoolCollector(off))
    names = {m.name for m in registry.collect()}
    assert names == {"gpuroute_standby_promotions", "gpuroute_standby_releases"}
    assert off.sizer.seasonal is None


def test_peers_arrivals_are_summed_and_old_or_garbled_peers_add_nothing() -> None:
    blobs = [
        msgpack.packb({"b1": 1.0, ARRIVALS_KEY: {MODEL: 2.5, "m2": 1}}),
        msgpack.packb({"b1": 2.0}),  # a peer of an older version
        msgpack.packb({ARRIVALS_KEY: [1, 2]}),
        msgpack.packb({ARRIVALS_KEY: {MODEL: "fast", "m2": -1.0, "m3": 0.5, "m4": math.inf}}),
        None,
        b"\xc1",
    ]
    assert merge_arrivals(map(decode_share, blobs)) == {MODEL: 2.5, "m2": 1.0, "m3": 0.5}
