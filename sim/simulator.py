"""Discrete-event fleet simulator driving the router's own scheduling core.

Arrivals go through `Scheduler.route` exactly as in the live router; engines are
EngineModel instances; completions go back through `Scheduler.finish` at end-of-stream.
A request that fails before its first token is retried on another backend as the live
router's own core objects allow (`Attempts`, `RetryBudget`, with their backoff); one whose
engine breaks mid-stream goes on elsewhere as the live router continues it
(`AttemptLoop.continued`: prompt + tokens so far, prefilled again there), or, where it
cannot, counts as failed and lost."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from gpuroute.router.core import BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.latency_prior import LatencyPrior
from gpuroute.router.core.lifetime import Event, Lifetimes, RequestLifetime
from gpuroute.router.core.placement import AttemptLoop, Step
from gpuroute.router.core.rebalance import Move, Rebalancer, RunningStream, expected_left
from gpuroute.router.core.retry import FailureKind, RetrySettings
from gpuroute.router.core.scheduler import Outcome
from gpuroute.router.core.slo import SloClasses, time_per_output_token
from gpuroute.router.core.slo_admission import HoldQueue
from gpuroute.router.core.watching import Watcher
from gpuroute.sim.adapters import LoraEngine, assign_adapters, build_engines
from gpuroute.sim.admission import SimAdmission
from gpuroute.sim.engine_model import EngineRequest
from gpuroute.sim.events import EventHeap
from gpuroute.sim.fleet import (
    GpuTypeProfile,
    assign_models,
    assign_request_classes,
    expand_gpus,
    expand_kinds,
    fleet_capacity_rps,
    request_work,
    sim_backends,
)
from gpuroute.sim.prepare import build_policy_for, prepare_workload
from gpuroute.sim.report import (
    FAILED,
    OK,
    REJECTED,
    PolicyReport,
    RunOutcomes,
    summarise,
)
from gpuroute.sim.scaling import BOOTED, SCALE, ScalingFleet, fixed_fleet_hours
from gpuroute.sim.scenario import LoadedScenario, Scenario
from gpuroute.sim.watch import SimWatch, attempt_of, gpu_paces
from gpuroute.sim.workloads import Workload

TICK, FAULT, RETRY = -1, -2, -3
ENDINGS = {OK: Event.FINISH, FAILED: Event.FAIL}  # the lifetime's ending of each status


class FleetSimulator:
    def __init__(
        self,
        loaded: LoadedScenario,
        prepared: tuple[Workload, dict[str, GpuTypeProfile], float] | None = None,
    ) -> None:
        self.loaded = loaded
        self.scenario = loaded.scenario
        self.workload, self.profiles, self.rate_rps = prepared or prepare_workload(loaded)
        self.gpu_types = expand_gpus(self.scenario)  # each engine's kind key
        self.kinds = expand_kinds(self.scenario)

    def at_utilization(self, utilization: float) -> FleetSimulator:
        """The same fleet and requests offered `utilization` of its nominal capacity (the
        trace is read and the GPU types profiled once, not per load)."""
        rate = utilization * fleet_capacity_rps(self.scenario, self.profiles)
        workload = self.workload.rescaled(rate / self.rate_rps)
        return FleetSimulator(self.loaded, (workload, self.profiles, rate))

    def run(self, policy_name: str, progress: Callable[[int], None] | None = None) -> PolicyReport:
        return self.replay(policy_name, progress)[0]

    def replay(
        self, policy_name: str, progress: Callable[[int], None] | None = None
    ) -> tuple[PolicyReport, RegionalRun]:
        """The report and the run behind it (each request's outcome, the engines)."""
        started = time.perf_counter()
        run = RegionalRun(self, policy_name, progress)
        run.run()
        report = summarise(
            policy_name,
            self.scenario,
            self.workload,
            run.outcomes,
            run.engines,
            run.work,
            wall_s=time.perf_counter() - started,
        )
        return replace(report, fleet=run.fleet_hours(report.sim_duration_s)), run


def rebalancer_for(scenario: Scenario, scheduler: Scheduler) -> Rebalancer | None:
    """The scenario's [rebalance], on its run's scheduler (None: off)."""
    config = scenario.rebalance
    return Rebalancer(scheduler, config.settings()) if config.enabled else None


class RegionalRun:
    """One policy's run over the fleet: arrivals, engine events, ticks, faults, retries,
    and streams that end mid-answer (an engine crashing under them, the rebalancer's
    moves): they go on elsewhere as the live router continues them."""

    def __init__(
        self, sim: FleetSimulator, policy_name: str, progress: Callable[[int], None] | None
    ) -> None:
        scenario, profiles, gpu_types = sim.scenario, sim.profiles, sim.gpu_types
        self.scenario, self.progress = scenario, progress
        self.peak_rps = sim.rate_rps  # the workload's rate (a daily shape's peak)
        self.engines = build_engines(
            [profiles[t].params for t in gpu_types], scenario.lora, scenario.prefix_caching
        )
        self.backends = sim_backends(profiles, gpu_types, sim.kinds)
        for backend in self.backends:  # the engines' adapter slots, as an agent reports them
            backend.adapter_slots = scenario.lora.max_loras if scenario.lora else 0
        self.index_of = {b.backend_id: i for i, b in enumerate(self.backends)}
        self.oracle = scenario.router.oracle_output_lengths
        estimator = CostEstimator(
            {t: p.prior for t, p in profiles.items()}, exact_max_tokens=self.oracle
        )
        policy = build_policy_for(policy_name, sim.loaded)
        latency = LatencyModel({t: LatencyPrior.from_engine(p.params) for t, p in profiles.items()})
        self.scheduler = Scheduler(BackendSet(self.backends), policy, estimator, latency=latency)
        self.hold_misses = scenario.router.slo_admission and self.scheduler.predicts_slo
        self.classes = scenario.slo_classes()
        ranked = SloClasses(self.classes, self.classes[0].name)
        self.held = HoldQueue(ranked, max_held=max(64, 16 * len(self.backends)))
        self.rng = random.Random(scenario.seed)
        # the live router's retry defaults; a close releases the request's bookings
        self.lifetimes = Lifetimes(RetrySettings(), self.scheduler)
        self.budget = self.lifetimes.budget
        self.scaling: ScalingFleet | None = None
        self.loop = self.attempt_loop()
        # and its watch: expected durations, slowness, rescues (router/core/watching.py)
        watcher = Watcher(self.scheduler, gpu_paces(profiles), scenario.router.rescue_slowness)
        self.watch = SimWatch(
            watcher,
            self.engines,
            self.backends,
            self.lifetimes,
            stream_paces=scenario.router.stream_paces,
        )
        workload = sim.workload
        self.n = len(workload)
        self.outcomes = RunOutcomes.pending(self.n)
        self.model_names, self.model_of = assign_models(self.n, scenario)
        self.outcomes.slo_class = assign_request_classes(self.n, scenario, self.model_of)
        self.outcomes.model = self.model_of
        self.fallbacks = {m.name: tuple(m.fallback) for m in scenario.models}
        self.arrivals = workload.arrivals.tolist()
        self.prompts = workload.prompts.tolist()
        self.outputs = workload.outputs.tolist()
        self.blocks, self.sessions = workload.blocks, workload.sessions
        self.adapters = assign_adapters(self.n, scenario.lora, scenario.seed)
        self.work = [0.0] * len(self.engines)
        self.engine_profiles = [profiles[t] for t in gpu_types]
        self.faults = sorted(scenario.faults, key=lambda f: f.at_s)
        self.heap = EventHeap(len(self.engines))
        self.rebalancer = rebalancer_for(scenario, self.scheduler)

    def attempt_loop(self) -> AttemptLoop:
        """The live router's admission and attempts loop (router/core/placement.py), with
        the warm standby of the scaling pools where the scenario's pools scale."""
        scenario = self.scenario
        if scenario.autoscale.enabled:
            self.scaling = ScalingFleet(
                self,
                scenario.autoscale,
                scenario.workload.daily,
                scenario.model_mix(),
                scenario.seed,
            )
        standby = self.scaling.standby if self.scaling else None
        self.admission = SimAdmission(self.scenario.router.max_inflight, self.scheduler.backends,
                                      standby, go=self.dispatch, refuse=self.refuse)  # fmt: skip
        return AttemptLoop(
            self.scheduler,
            self.budget,
            self.held if self.hold_misses else None,
            self.scaling.standby if self.scaling else None,
        )

    def run(self) -> None:
        start = self.arrivals[0] if self.n else 0.0
        self.heap.push(start, TICK)
        if self.scaling is not None:
            self.scaling.start(start)
            self.scaling.seed_history(start)
        for k, fault in enumerate(self.faults):
            self.heap.push(start + fault.at_s, FAULT, k)
        self.heap.run(self.arrivals, self.arrive, self.on_event)
        if self.progress is not None:
            self.progress(self.n)

    # -- events ----------------------------------------------------------------------------
    def arrive(self, i: int, now: float) -> None:
        model = self.model_names[self.model_of[i]]
        info = RequestInfo(
            i,
            model,
            self.prompts[i],
            self.outputs[i] if self.oracle else None,
            session_id=self.sessions[i],
            prefix_blocks=self.blocks[i],
            slo=self.classes[self.outcomes.slo_class[i]],
            arrived_at=now,
            fallbacks=self.fallbacks.get(model, ()),
            adapter=self.adapters[i],
        )
        life = self.lifetimes.open(info)
        if self.scaling is not None:
            self.scaling.sizer.arrive(model, now)
        self.admission.arrive(life, now)
        if self.admission.due:
            self.admission.let_in(now)
        if self.progress is not None and (i + 1) % max(self.n // 100, 1) == 0:
            self.progress(i + 1)

    def on_event(self, now: float, kind: int, payload: int, arrivals_left: bool) -> None:
        if kind >= 0:
            self.engine_event(kind, now)
        elif kind == TICK:
            self.scheduler.tick(now)
            for life in self.watch.tick(now):
                self.rescue(life, now)
            self.rebalance(now)
            for refusal in self.loop.expire(now):
                self.end(refusal.item, REJECTED)
            self.admission.tick(now)
            if arrivals_left or len(self.lifetimes):  # held and backing-off ones too
                self.heap.push(now + self.scenario.router.health_tick_s, TICK)
        elif kind == FAULT:
            self.apply_fault(self.faults[payload], now)
        elif kind in (SCALE, BOOTED):
            assert self.scaling is not None
            self.scaling.on_event(kind, payload, now, arrivals_left or bool(len(self.lifetimes)))
        elif (life := self.lifetimes.get(payload)) is not None:  # RETRY after its backoff
            self.dispatch(life, now)
        if self.admission.due:
            self.admission.let_in(now)

    def engine_event(self, e: int, now: float) -> None:
        engine = self.engines[e]
        finished = engine.on_event(now)
        assert engine.first_tokens is not None  # built with report_first_tokens
        for req in engine.first_tokens:
            life = self.lifetimes.get(req.rid)
            if life is not None:
                life.move(Event.FIRST_BYTE)
                self.scheduler.first_token(life, now, now - req.submitted_at)
        engine.first_tokens.clear()
        for req in finished:
            self.complete(req, e, now)
        self.reschedule(e)
        if self.scaling is not None and finished:
            self.scaling.finished(e, now)
        self.offer_room(now)

    def fleet_hours(self, duration_s: float) -> dict[str, float]:
        """GPU-hours and cost over the run (from the first arrival, `duration_s` long)."""
        start = self.arrivals[0] if self.n else 0.0
        if self.scaling is None:
            return fixed_fleet_hours(self, start, start + duration_s)
        return self.scaling.close(start + duration_s)

    def reschedule(self, e: int) -> None:
        engine = self.engines[e]
        self.heap.reschedule(e, engine.next_event_time())
        if isinstance(engine, LoraEngine) and engine.residency_changed:
            # the router sees its adapters at once (live: within an agent report)
            self.backends[e].adapters = engine.adapters()
            engine.residency_changed = False

    # -- a request's attempts --------------------------------------------------------------
    def dispatch(self, life: RequestLifetime, now: float, prefer: str | None = None) -> None:
        """Route it (the live router's loop): send it, hold it, or end it."""
        while True:
            placement = self.loop.route(life, now, self.rng, prefer)
            for refusal in placement.refused:
                self.end(refusal.item, REJECTED)
            if placement.step is Step.NONE:
                self.end(life, FAILED if life.tried else REJECTED)
                return
            if placement.step is Step.HOLD:
                if self.scaling is not None and not placement.yielded:
                    self.scaling.sizer.held(life.info.model)
                return
            if self.send(life, placement.decision, now):
                return

    def offer_room(self, now: float) -> None:
        """A booking was released (as the live router offers room on every release)."""
        if len(self.held):
            self.retry_held(now)

    def retry_held(self, now: float) -> None:
        """Room may have freed up: offer it to held requests, most important first."""
        for life, decision in self.loop.offer_room(now, self.rng):
            if not self.send(life, decision, now):
                self.dispatch(life, now)

    def send(self, life: RequestLifetime, decision, now: float) -> bool:
        """Hand a booked request to its engine; False when it must be routed again now."""
        rid = life.request_id
        e = self.index_of[decision.backend.backend_id]
        resumed = life.continued
        # a continuation's prompt holds what its client had; its output is what is left
        output = self.outputs[rid] - (resumed.delivered if resumed else 0)
        prompt = life.info.prompt_tokens
        req = EngineRequest(
            rid, prompt, output, self.arrivals[rid], self.blocks[rid], self.adapters[rid]
        )
        if not self.engines[e].fits(req):
            self.scheduler.release(life)
            self.end(life, REJECTED if resumed is None else FAILED)
            return True
        life.attempts.start(self.budget)
        if self.engines[e].submit(req, now):
            self.watch.sent(life, e, req, now)
            self.reschedule(e)
            if resumed is not None:
                self.outcomes.reprefill_tokens += prompt  # as the live counter counts it
            return True
        # Engine down: connection refused before any byte; retry elsewhere if allowed.
        life.attempts.end(self.budget)
        self.scheduler.finish(life, Outcome(False, fatal=True), now)
        return not self.may_retry(life, FailureKind.REFUSED, now)

    def may_retry(self, life: RequestLifetime, kind: FailureKind, now: float) -> bool:
        """After a failed attempt: True to retry now; False when the request failed or its
        retry waits for its backoff (a RETRY event)."""
        retry = self.loop.failed(life, kind, self.rng)
        if not retry.go:
            self.end(life, FAILED)
            return False
        self.outcomes.retries += 1
        if retry.delay_s:
            self.heap.push(now + retry.delay_s, RETRY, life.request_id)
            return False
        return True

    def end(self, life: RequestLifetime, status: int) -> None:
        """The request is over (served, failed or refused): it leaves the router's books."""
        self.outcomes.status[life.request_id] = status
        if status == FAILED and life.continued is not None:
            self.outcomes.lost += 1  # its client had part of an answer: a truncated one
        ending = ENDINGS.get(status, Event.REFUSE)
        if self.lifetimes.close(life, ending).admitted:
            self.admission.released()

    def refuse(self, life: RequestLifetime) -> None:
        self.end(life, REJECTED)

    def complete(self, req: EngineRequest, e: int, now: float) -> None:
        rid = req.rid
        life = self.lifetimes.get(rid)
        assert life is not None
        resumed = life.continued
        # the client's view: its first token, the whole answer (a continuation's pause in it)
        first = req.first_token_at if resumed is None else resumed.first_token_at
        tpot = time_per_output_token(first, now, self.outputs[rid])
        met = life.info.slo.met(first - req.arrival, tpot, now - req.arrival)
        outcome = Outcome(  # a continuation's engine is judged on its own part (as live)
            True,
            req.output_tokens,
            req.prompt_tokens,
            latency_ratio=self.watch.succeeded(life, req, now),
            tpot_s=tpot if resumed is None else None,
            met_slo=met if resumed is None else None,
        )
        self.scheduler.finish(life, outcome, now)
        if self.scaling is not None:
            self.scaling.sizer.served(life.info.model, req.prompt_tokens, req.output_tokens)
        run = self.outcomes
        run.ttft[rid] = first - req.arrival
        run.finish[rid] = now
        run.served_by[rid] = e
        uncached = req.prompt_tokens - req.cached_tokens
        self.work[e] += request_work(self.engine_profiles[e], uncached, req.output_tokens)
        if resumed is not None:
            run.reprefill_work += request_work(self.engine_profiles[e], uncached, 0)
        life.attempts.end(self.budget)
        self.end(life, OK)

    def rescue(self, life: RequestLifetime, now: float) -> None:
        """Move an attempt still waiting for its first token off a backend that turned bad
        (the live watch's rescue): the engine drops it, its time so far informs slowness,
        its booking goes with no verdict, and the attempts loop sends it elsewhere."""
        attempt = attempt_of(life)
        assert attempt is not None
        e = attempt.engine
        self.engines[e].abort(attempt.req, now)
        self.reschedule(e)
        self.watch.gave_up(life, now)
        self.scheduler.release(life)
        life.attempts.end(self.budget)
        if self.may_retry(life, FailureKind.RESCUED, now):
            self.dispatch(life, now)
        self.offer_room(now)

    # -- streams that end mid-answer --------------------------------------------------------
    def apply_fault(self, fault, now: float) -> None:
        engine = self.engines[fault.gpu]
        if fault.kind == "slow":
            engine.set_slowdown(fault.factor, now)
        elif fault.kind == "recover":
            engine.set_slowdown(1.0, now)
            engine.recover(now)
        else:
            for req in engine.crash(now):
                self.crashed(req, fault.gpu, now)
            self.offer_room(now)
        self.reschedule(fault.gpu)

    def crashed(self, req: EngineRequest, e: int, now: float) -> None:
        life = self.lifetimes.get(req.rid)
        if life is None:
            return
        life.attempts.end(self.budget)
        self.watch.ended(life)
        self.scheduler.finish(life, Outcome(False, fatal=True), now)
        if req.first_token_at >= 0:  # the stream broke under its client
            self.go_on(life, self.engines[e].tokens_generated(req, now), req.first_token_at, now)
            return
        # Nothing reached the client (from this attempt): the router retries elsewhere.
        if self.may_retry(life, FailureKind.CONNECTION, now):
            self.dispatch(life, now)

    def go_on(
        self,
        life: RequestLifetime,
        generated: int,
        first: float,
        now: float,
        prefer: str | None = None,
    ) -> None:
        """A stream whose attempt ended after `generated` tokens goes on elsewhere (the live
        StreamContinuer's way), or ends failed where continuation is off or spent."""
        resumed = life.continued_or_new(first)
        resumed.delivered += generated
        config = self.scenario.continuation
        if not config.enabled or resumed.continuations >= config.max_attempts:
            self.end(life, FAILED)
            return
        resumed.continuations += 1
        self.outcomes.continued += 1
        self.loop.continued(life, generated)
        self.dispatch(life, now, prefer)

    # -- rebalancing -----------------------------------------------------------------------
    def rebalance(self, now: float) -> None:
        """The router's tick: the streams the rebalancer moves, moved."""
        if self.rebalancer is None:
            return
        moves = self.rebalancer.plan(self.running_streams(now), now)
        for move in moves:
            self.move(move, now)
        if moves:  # (their bookings released: as on every release)
            self.offer_room(now)

    def running_streams(self, now: float) -> Iterator[RunningStream]:
        """Each stream under way that may still be continued, as the live router would see
        it (the engine model counts the tokens its relay would have)."""
        config = self.scenario.continuation  # (enabled: the scenario refuses moves without)
        for life in list(self.lifetimes):
            attempt = attempt_of(life)
            if attempt is None or attempt.req.first_token_at < 0 or life.latency is None:
                continue
            resumed = life.continued
            if resumed is not None and resumed.continuations >= config.max_attempts:
                continue
            generated = self.engines[attempt.engine].tokens_generated(attempt.req, now)
            expected = life.latency.kv_tokens - life.info.prompt_tokens  # its booking's guess
            first = attempt.req.first_token_at if resumed is None else resumed.first_token_at
            yield RunningStream(
                life,
                self.backends[attempt.engine],
                first,
                generated + (resumed.delivered if resumed else 0),
                expected_left(expected, generated),
                life.info.prompt_tokens + generated,
            )

    def move(self, move: Move, now: float) -> None:
        """Take the stream off its engine (as a client that left: its KV freed) and
        continue it, preferring the target; its backend gets no verdict."""
        life = move.stream.life
        attempt = attempt_of(life)
        assert attempt is not None
        generated = self.engines[attempt.engine].tokens_generated(attempt.req, now)
        self.engines[attempt.engine].abort(attempt.req, now)
        self.reschedule(attempt.engine)
        self.watch.ended(life)
        self.scheduler.release(life)
        life.attempts.end(self.budget)
        self.outcomes.moved += 1
        self.go_on(life, generated, attempt.req.first_token_at, now, move.to.backend_id)
