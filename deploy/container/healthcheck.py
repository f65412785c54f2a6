#!/usr/bin/env python3
"""The container image's HEALTHCHECK: one image runs any tier, so the check finds the
gpuroute process in the container (`gpuroute router --config FILE`, `global`, `agent`,
`fake-engine`), reads the port that tier listens on from its config (or flags) and asks
that port for its liveness: /healthz on the router's and the global tier's public
listener, on the agent's admin listener, /health on the fake engine.

`gpuroute-healthcheck URL` probes URL instead. Exit 0: healthy; 1: not (the reason on
stderr, which `docker inspect` shows). Standard library only."""

from __future__ import annotations

import ssl
import sys
import tomllib
import urllib.request
from pathlib import Path

# tier -> (the config table of the listener to probe, its default port, the path)
LISTENERS = {
    "router": ("listen", 8080, "/healthz"),
    "global": ("listen", 8090, "/healthz"),
    "agent": ("admin", 7071, "/healthz"),
}
ANY_ADDRESS = {"", "0.0.0.0", "*"}


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in args (the last one wins)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def gpuroute_process() -> tuple[Path, list[str]]:
    """The lowest-numbered process running `gpuroute TIER ...`: its /proc directory and the
    arguments after `gpuroute` (PID 1 unless the container runs an init such as --init)."""
    pids = sorted(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except (OSError, UnicodeDecodeError):
            continue
        for i, arg in enumerate(argv[:3]):
            if Path(arg).name == "gpuroute" and len(argv) > i + 1:
                return Path(f"/proc/{pid}"), argv[i + 1 :]
    raise LookupError("no `gpuroute TIER` process in this container")


def url_of(proc: Path, args: list[str]) -> str:
    """The liveness URL of the tier that `gpuroute` runs with these arguments."""
    tier = args[0]
    if tier == "fake-engine":
        host, port, scheme = flag(args, "--host") or "127.0.0.1", flag(args, "--port"), "http"
        return f"{scheme}://{local(host)}:{port or 8000}/health"
    if tier not in LISTENERS:
        raise LookupError(f"gpuroute {tier} has no listener to probe")
    config = flag(args, "--config")
    if config is None:
        raise LookupError(f"gpuroute {tier} runs without --config")
    path = proc / "cwd" / config  # a relative path is the process's own
    try:
        table = tomllib.loads(path.read_text()).get(LISTENERS[tier][0], {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LookupError(f"cannot read {config}: {exc}") from None
    host, port = table.get("host", "127.0.0.1"), table.get("port", LISTENERS[tier][1])
    scheme = "https" if table.get("tls") is not None else "http"
    return f"{scheme}://{local(host)}:{port}{LISTENERS[tier][2]}"


def local(host: str) -> str:
    """Where this container reaches a listener bound to host."""
    if host in ANY_ADDRESS:
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def probe(url: str) -> None:
    """Raise unless url answers 200. Certificates are not checked: this is the container
    asking its own listener whether it is up, not a client trusting it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=2, context=context) as response:
        if response.status != 200:
            raise OSError(f"answered {response.status}")


def main(argv: list[str]) -> int:
    try:
        url = argv[1] if len(argv) > 1 else url_of(*gpuroute_process())
    except LookupError as exc:
        print(f"gpuroute-healthcheck: unhealthy: {exc}", file=sys.stderr)
        return 1
    try:
        probe(url)
    except OSError as exc:
        print(f"gpuroute-healthcheck: unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    print(f"gpuroute-healthcheck: {url} is up")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
