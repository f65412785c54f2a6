"""Per-policy results of a simulator run: the JSON schema and the table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpuroute.stats import percentile

if TYPE_CHECKING:
    from gpuroute.sim.engine_model import EngineModel
    from gpuroute.sim.scenario import Scenario
    from gpuroute.sim.workloads import Workload

OK, REJECTED, FAILED, PENDING = 0, 1, 2, 3


@dataclass(slots=True)
class RunOutcomes:
    """Per-request outcomes of one run, indexed by request id."""

    status: list[int]
    ttft: list[float]
    finish: list[float]
    served_by: list[int]  # engine index of each completed request (-1 otherwise)
    retries: int = 0
    slo_class: list[int] = field(default_factory=list)  # index into the scenario's classes
    model: list[int] = field(default_factory=list)  # index into the workload's models
    continued: int = 0  # times a stream went on elsewhere after its attempt ended mid-answer
    moved: int = 0  # of them, the rebalancer's moves
    lost: int = 0  # streams that ended failed after their client had part of an answer
    reprefill_tokens: int = 0  # prompt tokens sent to continue streams (prompt + so far)
    reprefill_work: float = 0.0  # GPU capacity-seconds their uncached prefill cost

    @classmethod
    def pending(cls, n: int) -> RunOutcomes:
        return cls([PENDING] * n, [float("nan")] * n, [float("nan")] * n, [-1] * n, 0, [0] * n)


@dataclass(frozen=True, slots=True)
class PolicyReport:
    """One policy's results; field order is the JSON key order."""

    policy: str
    requests: int
    completed: int
    rejected: int
    failed: int
    retries: int
    # streams whose engine broke mid-answer (or that were moved): continuations made, and
    # streams that ended truncated; the prompt tokens continuations sent (the original
    # prompt and the text so far) as a share of the workload's, and the GPU work their
    # prefill cost as a share of all served work
    streams_continued: int
    streams_moved: int
    streams_lost: int
    reprefill_share: float
    reprefill_work_share: float
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    throughput_rps: float
    output_tokens_per_s: float
    goodput_rps: float
    slo_attainment: float
    gpu_util_mean: float
    gpu_util_cv: float
    gpu_busy_mean: float  # fraction of time engines were computing (nvidia-smi's util)
    gpu_busy_cv: float
    prefix_hit_rate: float
    kv_peak_max: float  # highest KV-cache use of any engine, as a fraction of its capacity
    sim_duration_s: float
    sim_wall_s: float
    # per GPU type: its share of completed requests, E2E p99 and median time per output
    # token, to see which type sets the tail
    by_gpu_type: dict[str, dict[str, float]]
    # per SLO class: its share of requests and the share of them that met the class
    by_slo_class: dict[str, dict[str, float]]
    # per requested model, when the workload has several: share, attainment, how many a
    # fallback model served, refused
    by_model: dict[str, dict[str, float]] = field(default_factory=dict)
    # per requested model and the SLO classes its requests are in: bounds, share, attainment
    # (what `plan` judges each pool by; in the JSON with by_model)
    by_model_and_class: list[dict[str, object]] = field(default_factory=list)
    # LoRA adapters loaded into engine slots, all engines together (None: no adapters,
    # and the key is left out of the JSON)
    adapter_loads: int | None = None
    # GPU-hours and cost over the run (every engine on, or the scaling pools' on-time)
    fleet: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        if not self.by_model:  # a single-model run's JSON as before
            del out["by_model"], out["by_model_and_class"]
        if self.adapter_loads is None:
            del out["adapter_loads"]
        return out


def _r(value: float, digits: int = 4) -> float:
    return round(float(value), digits) if np.isfinite(value) else float("nan")


def summarise(
    policy: str,
    scenario: Scenario,
    workload: Workload,
    run: RunOutcomes,
    engines: list[EngineModel],
    work: list[float],
    *,
    wall_s: float,
) -> PolicyReport:
    status = np.asarray(run.status)
    ok = status == OK
    arrivals = workload.arrivals
    finish = np.asarray(run.finish)[ok]
    ttft = np.asarray(run.ttft)[ok]
    e2e = finish - arrivals[ok]
    outputs = workload.outputs[ok]
    tpot = np.where(outputs > 1, (e2e - ttft) / np.maximum(outputs - 1, 1), 0.0)
    start = float(arrivals[0]) if len(arrivals) else 0.0
    end = float(finish.max()) if len(finish) else start
    duration = max(end - start, 1e-9)
    classes = scenario.slo_classes()
    class_of = np.asarray(run.slo_class, dtype=np.int64)
    good = met_slo(classes, class_of[ok], ttft, tpot, e2e)
    util = np.asarray(work) / duration
    busy = np.asarray([e.busy_s for e in engines]) / duration
    return PolicyReport(
        policy=policy,
        requests=len(status),
        completed=int(ok.sum()),
        rejected=int((status == REJECTED).sum()),
        failed=int((status == FAILED).sum()),
        retries=run.retries,
        **continuations(run, workload, work),
        ttft_p50_s=_r(percentile(ttft, 50)),
        ttft_p99_s=_r(percentile(ttft, 99)),
        e2e_p50_s=_r(percentile(e2e, 50)),
        e2e_p99_s=_r(percentile(e2e, 99)),
        tpot_p50_s=_r(percentile(tpot, 50)),
        tpot_p99_s=_r(percentile(tpot, 99)),
        throughput_rps=_r(ok.sum() / duration),
        output_tokens_per_s=_r(outputs.sum() / duration, 1),
        goodput_rps=_r(good.sum() / offered_window_s(arrivals)),
        slo_attainment=_r(good.sum() / max(len(status), 1)),
        gpu_util_mean=_r(util.mean()),
        gpu_util_cv=_r(util.std() / util.mean() if util.mean() > 0 else 0.0),
        gpu_busy_mean=_r(busy.mean()),
        gpu_busy_cv=_r(busy.std() / busy.mean() if busy.mean() > 0 else 0.0),
        prefix_hit_rate=prefix_hit_rate(engines),
        kv_peak_max=_r(max(e.kv_peak / e.kv_capacity for e in engines)),
        sim_duration_s=_r(duration, 2),
        sim_wall_s=_r(wall_s, 2),
        by_gpu_type=by_gpu_type(np.asarray(run.served_by)[ok], engines, e2e, tpot),
        by_slo_class=by_slo_class(classes, class_of, ok, good, ttft),
        by_model=by_model(scenario, run, engines, ok, good),
        by_model_and_class=by_model_and_class(scenario, run, ok, good, class_of),
        adapter_loads=adapter_loads(engines),
    )


def continuations(run: RunOutcomes, workload: Workload, work: list[float]) -> dict[str, float]:
    """Streams continued (moved, of them) and lost; what their re-prefill cost."""
    return {
        "streams_continued": run.continued,
        "streams_moved": run.moved,
        "streams_lost": run.lost,
        "reprefill_share": _r(run.reprefill_tokens / max(int(workload.prompts.sum()), 1), 5),
        "reprefill_work_share": _r(run.reprefill_work / sum(work) if sum(work) > 0 else 0.0, 5),
    }


def prefix_hit_rate(engines: list[EngineModel]) -> float:
    lookups = sum(e.prefix_cache.lookups for e in engines)
    hits = sum(e.prefix_cache.hits for e in engines)
    return _r(hits / lookups if lookups else 0.0)


def adapter_loads(engines: list[EngineModel]) -> int | None:
    """Adapter loads over all engines; None where no engine has adapter slots."""
    loads = [getattr(e, "adapter_loads", None) for e in engines]
    counted = [n for n in loads if n is not None]
    return sum(counted) if counted else None


def offered_window_s(arrivals: np.ndarray) -> float:
    """The span over which the load was offered, the denominator of goodput: requests that
    met their SLO per second of offered traffic (attainment x offered rate). The drain after
    the last arrival is left out: its length is set by the single longest answer, not by
    how well the fleet kept up."""
    if len(arrivals) < 2:
        return 1.0
    span = float(arrivals[-1] - arrivals[0])
    return max(span * len(arrivals) / (len(arrivals) - 1), 1e-9)


def met_slo(classes, class_of: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray):
    """Per served request: whether it met its own class's TTFT, TPOT and deadline."""
    ttft_cap = np.asarray([c.ttft_s for c in classes])[class_of]
    tpot_cap = np.asarray([c.tpot_s for c in classes])[class_of]
    e2e_cap = np.asarray([c.e2e_s or np.inf for c in classes])[class_of]
    return (ttft <= ttft_cap) & (tpot <= tpot_cap) & (e2e <= e2e_cap)


def by_slo_class(classes, class_of: np.ndarray, ok: np.ndarray, good: np.ndarray, ttft):
    served_class = class_of[ok]
    out = {}
    for k, slo in enumerate(classes):
        mine = class_of == k
        count = int(mine.sum())
        met = int(good[served_class == k].sum())
        out[slo.name] = {
            "request_share": _r(count / max(len(class_of), 1)),
            "attainment": _r(met / count) if count else float("nan"),
            "refused": int((mine & ~ok).sum()),
            "ttft_p99_s": _r(percentile(ttft[served_class == k], 99)),
        }
    return out


def by_model(
    scenario: Scenario, run: RunOutcomes, engines: list[EngineModel], ok: np.ndarray, good
) -> dict[str, dict[str, float]]:
    """Each requested model's share, attainment, fallbacks and refusals (several models)."""
    names = list(scenario.model_mix())
    if len(names) < 2:
        return {}
    asked = np.asarray(run.model, dtype=np.int64)
    engine_model = np.asarray([names.index(e.params.model.name) if e.params.model.name in names
                               else -1 for e in engines])  # fmt: skip
    served = engine_model[np.asarray(run.served_by)[ok].astype(int)]
    asked_ok = asked[ok]
    out = {}
    for k, name in enumerate(names):
        mine = asked == k
        count = int(mine.sum())
        out[name] = {
            "request_share": _r(count / max(len(asked), 1)),
            "attainment": _r(good[asked_ok == k].sum() / count) if count else float("nan"),
            "served_by_fallback": int(((asked_ok == k) & (served != k)).sum()),
            "refused": int((mine & ~ok).sum()),
        }
    return out


def by_model_and_class(
    scenario: Scenario, run: RunOutcomes, ok: np.ndarray, good: np.ndarray, class_of
) -> list[dict[str, object]]:
    """Attainment of each requested model's requests in each SLO class they are in (what
    `plan` judges pools by): model, class, its bounds, share of the model's requests. `good`
    is summarise's, over the served requests."""
    met = np.zeros(len(ok), dtype=bool)
    met[ok] = good
    asked = np.asarray(run.model, dtype=np.int64)
    rows: list[dict[str, object]] = []
    for m, model in enumerate(scenario.model_mix()):
        mine = asked == m
        for k, slo in enumerate(scenario.slo_classes()):
            cell = mine & (class_of == k)
            if cell.any():
                rows.append({
                    "model": model, "slo_class": slo.name, "ttft_s": slo.ttft_s,
                    "tpot_s": slo.tpot_s, "request_share": _r(cell.sum() / mine.sum()),
                    "attainment": _r(met[cell].mean()),
                })  # fmt: skip
    return rows


def by_gpu_type(
    served_by: np.ndarray, engines: list[EngineModel], e2e: np.ndarray, tpot: np.ndarray
) -> dict[str, dict[str, float]]:
    names = list(dict.fromkeys(e.params.name for e in engines))
    # each served request's GPU type as its index in `names` (not a million strings)
    types = np.asarray([names.index(e.params.name) for e in engines])[served_by.astype(int)]
    out = {}
    for k, name in enumerate(names):
        mine = types == k
        out[name] = {
            "request_share": _r(mine.sum() / max(len(e2e), 1)),
            "e2e_p99_s": _r(percentile(e2e[mine], 99)),
            "tpot_p50_s": _r(percentile(tpot[mine], 50)),
        }
    return out


TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "{}"),
    ("completed", "done", "{:,}"),
    ("rejected", "rej", "{:,}"),
    ("failed", "fail", "{:,}"),
    ("ttft_p50_s", "TTFT p50", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99", "{:.3f}"),
    ("e2e_p99_s", "E2E p99", "{:.2f}"),
    ("throughput_rps", "req/s", "{:.1f}"),
    ("output_tokens_per_s", "tok/s", "{:,.0f}"),
    ("goodput_rps", "goodput", "{:.1f}"),
    ("slo_attainment", "SLO met", "{:.3f}"),
    ("gpu_util_mean", "util", "{:.2f}"),
    ("prefix_hit_rate", "prefix hit", "{:.2f}"),
    ("sim_wall_s", "wall s", "{:.1f}"),
)
# shown after "prefix hit" when the scenario has LoRA adapters
ADAPTER_COLUMN = ("adapter_loads", "LoRA loads", "{:,}")
# shown after "fail" when a stream broke mid-answer in some run
STREAM_COLUMNS = (
    ("streams_continued", "cont", "{:,}"),
    ("streams_lost", "lost", "{:,}"),
    ("reprefill_share", "re-prefill", "{:.2%}"),
)


def table_columns(rows: list[dict[str, object]]) -> tuple[tuple[str, str, str], ...]:
    """The table's columns: continuations where a stream broke, the adapter loads where
    adapters are in play."""
    columns = TABLE_COLUMNS
    if any(row.get("streams_continued") or row.get("streams_lost") for row in rows):
        after = [key for key, _, _ in columns].index("failed") + 1
        columns = (*columns[:after], *STREAM_COLUMNS, *columns[after:])
    if any("adapter_loads" in row for row in rows):
        columns = (*columns[:-1], ADAPTER_COLUMN, columns[-1])
    return columns
