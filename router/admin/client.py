"""How the CLI reaches a router's admin listener (`gpuroute explain`, `gpuroute admin`): its
URL and admin token come from the router's TOML, a flag or $GPUROUTE_ADMIN_TOKEN, never
from a token on the command line; a refusal comes back as the server's own message."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOKEN_ENV = "GPUROUTE_ADMIN_TOKEN"
TIMEOUT_S = 10.0


class AdminCallFailed(Exception):
    """The listener refused (its status and message) or could not be reached (its URL)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="the router's TOML: its admin listener and admin token"
    )
    parser.add_argument(
        "--admin-url",
        metavar="URL",
        help="the router's admin listener (default: from --config, else the default "
        "admin_listen, http://127.0.0.1:9090)",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"the admin token, one line (default: from --config, else ${TOKEN_ENV})",
    )


@dataclass(frozen=True)
class AdminListener:
    url: str
    token: str | None

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> AdminListener:
        """--admin-url, else --config's admin listener, else the default one; the token from
        --token-file, else --config's admin token, else $GPUROUTE_ADMIN_TOKEN."""
        from gpuroute.router.config.router import RouterConfig, load_router_config

        from gpuroute.secrets import read_secret, read_secret_file

        token = args.token_file and read_secret_file(args.token_file, "--token-file")
        config = None if args.config is None else load_router_config(args.config)
        if config is not None and token is None:
            token = read_secret(config, "admin_token", "router")
        token = token or os.environ.get(TOKEN_ENV) or None
        if args.admin_url is not None:
            return cls(args.admin_url.rstrip("/"), token)
        if config is None:
            return cls(_listener_url(RouterConfig.model_fields["admin_listen"].default), token)
        listen = config.listen if config.admin_on_public_listener else config.admin_listen
        return cls(_listener_url(listen), token)

    def call(self, method: str, path: str, body: dict | None = None) -> Any:
        """The answer's JSON; AdminCallFailed with the server's message on a non-2xx."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as exc:
            message = f"{exc.code}: {error_message(exc)}"
            if exc.code == 401 and not self.token:
                message += f" (no admin token given: --token-file, --config or ${TOKEN_ENV})"
            raise AdminCallFailed(message) from None
        except (urllib.error.URLError, OSError) as exc:
            raise AdminCallFailed(f"cannot reach {self.url}: {exc}") from None
        except ValueError:
            raise AdminCallFailed(f"{self.url}{path}: the answer is not JSON") from None


def _listener_url(listen) -> str:
    host = "127.0.0.1" if listen.host in ("0.0.0.0", "::", "") else listen.host
    return listen.model_copy(update={"host": host}).url()


def error_message(exc: urllib.error.HTTPError) -> str:
    """The OpenAI-format error's message, or the HTTP reason when the body is not one."""
    try:
        error = json.loads(exc.read() or b"{}").get("error")
    except (ValueError, AttributeError):
        error = None
    return error.get("message", exc.reason) if isinstance(error, dict) else str(exc.reason)


def run_call(
    args: argparse.Namespace,
    command: str,
    call: tuple[str, str, dict | None],
    show: Callable[[Any], None],
) -> int:
    """One admin call as a command makes it (`call`: method, path, body): its answer
    shown, or the router's refusal (or the unreachable listener) on stderr and exit 1."""
    try:
        answer = AdminListener.from_arguments(args).call(*call)
    except AdminCallFailed as exc:
        print(f"gpuroute {command}: {exc}", file=sys.stderr)
        return 1
    show(answer)
    return 0
