"""The simulator watches backends as the live router does, through the same core
(router/core/watching.py): a GPU that turns 20x slow is read as slow, and attempts still
waiting for their first token there are rescued elsewhere; a healthy fleet sees no rescue,
and however a request ends it leaves nothing booked."""

from __future__ import annotations

from pathlib import Path

from gpuroute.sim.scenario import load_scenario
from gpuroute.sim.simulator import FleetSimulator

SCENARIO = """
name = "slow-h100"
seed = 3
[workload]
profile = "chat"
target_utilization = 0.7
max_requests = 2500
[[gpus]]
type = "H100"
count = 2
[[gpus]]
type = "A100"
count = 2
[router]
policies = ["default"]
rescue_slowness = {rescue}
stream_paces = {paces}
health_tick_s = 0.5
"""
SLOW = '[[faults]]\nat_s = 5\nkind = "slow"\ngpu = 0\nfactor = 20\n'


def replay(tmp_path: Path, rescue: float, faults: str = SLOW, paces: bool = False):
    path = tmp_path / f"s-{rescue}-{paces}.toml"
    path.write_text(SCENARIO.format(rescue=rescue, paces=str(paces).lower()) + faults)
    report, run = FleetSimulator(load_scenario(path)).replay("default")
    return report, run


def test_a_gpu_turned_slow_is_read_as_slow_and_its_waiting_attempts_are_moved(tmp_path) -> None:
    report, run = replay(tmp_path, rescue=10.0)
    slowed, healthy = run.backends[0], run.backends[1:]
    assert slowed.slowness >= run.watch.watcher.slowness.deadband
    assert all(b.slowness == 1.0 for b in healthy)
    assert run.watch.rescues > 0 and report.retries >= run.watch.rescues
    assert report.completed + report.failed + report.rejected == report.requests == 2500
    assert len(run.lifetimes) == 0 and len(run.scheduler.ledger) == 0
    assert all(b.in_flight == 0 and b.outstanding == 0 for b in run.backends)


def test_rescue_is_off_at_zero_and_a_healthy_fleet_moves_nothing(tmp_path) -> None:
    _, off = replay(tmp_path, rescue=0.0)
    assert off.watch.rescues == 0
    assert off.backends[0].slowness >= off.watch.watcher.slowness.deadband  # still read as slow
    _, healthy = replay(tmp_path, rescue=10.0, faults="")
    assert healthy.watch.rescues == 0
    assert all(b.slowness == 1.0 for b in healthy.backends)


def test_streams_paces_read_the_slow_gpu_sooner_and_move_more(tmp_path) -> None:
    """With the live watch's stream paces (`router.stream_paces`), the slowed GPU is read
    from its streams as well as from what it finished, so more waiting attempts move."""
    _, paced = replay(tmp_path, rescue=10.0, paces=True)
    _, finished_only = replay(tmp_path, rescue=10.0)
    assert paced.watch.rescues > finished_only.watch.rescues > 0
    assert paced.backends[0].slowness >= paced.watch.watcher.slowness.deadband
