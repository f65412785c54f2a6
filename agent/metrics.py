"""The agent's Prometheus metrics, in a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from gpuroute.process_metrics import register_process_metrics


class AgentMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        register_process_metrics(r, "agent")
        self.health = Gauge(
            "gpuroute_agent_health", "1 for the current health state.", ["state"], registry=r
        )
        self.transitions = Counter(
            "gpuroute_agent_health_transitions_total", "Health transitions.", ["to"], registry=r
        )
        self.consul_up = Gauge(
            "gpuroute_agent_consul_up", "Whether the last Consul call worked.", registry=r
        )
        self.watchers = Gauge(
            "gpuroute_agent_load_watchers", "Routers streaming this agent's load.", registry=r
        )
        self.scrape_errors = Counter(
            "gpuroute_agent_engine_scrape_errors_total",
            "Failed engine /metrics scrapes.",
            registry=r,
        )
        self.standby = Gauge(
            "gpuroute_agent_standby",
            "1 while the host stands by: warm, registered with Meta standby, out of rotation.",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
