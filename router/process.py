"""How a router process runs: alone, as the parent of several workers, or as one of them."""

from __future__ import annotations

from gpuroute.router.config.router import RouterConfig, load_router_config
from gpuroute.router.http.server import RouterApp
from gpuroute.router.workers.parent import Supervisor, WorkerRole, die_with_parent, resolve_count

from gpuroute import runtime
from gpuroute.serving import DrainingServer, WorkerSockets


class RouterServer(DrainingServer):
    """Listen, serve, and on SIGTERM/SIGINT drain: stop accepting, finish streams, exit."""

    def __init__(self, router: RouterApp, role: WorkerRole | None = None) -> None:
        if role is None:
            super().__init__(router, "router")
            return
        sockets = WorkerSockets(role.admin_socket, role.count)
        super().__init__(router, f"router worker {role.index + 1}/{role.count}", sockets)


def run_router(path: str, workers: int | str | None = None, role: WorkerRole | None = None) -> int:
    """One process, the parent of several workers (`workers`, else `workers.count`), or
    one of those workers (`role`)."""
    if role is not None:
        die_with_parent()

        def start(config: RouterConfig):
            listen = config.listen.model_copy(update={"port": role.port})
            config = config.model_copy(update={"listen": listen})
            return RouterServer(RouterApp(config, role=role, path=path), role).serve()

        return runtime.run_from_config("router", path, load_router_config, start)

    def start_one_or_many(config: RouterConfig):
        count = resolve_count(workers if workers is not None else config.workers.count)
        if count == 1:
            return RouterServer(RouterApp(config, path=path)).serve()
        return Supervisor(path, config, count).serve()

    return runtime.run_from_config("router", path, load_router_config, start_one_or_many)
