"""`gpuroute admin ...`: a running router's admin API from a shell (docs/operations.md,
"Reload and the admin API"). Each subcommand is one call to the admin listener; `--json`
prints the answer as the API gives it. An API key is hashed here: only its sha256 travels."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from gpuroute.router.admin import show
from gpuroute.router.admin.client import add_arguments, run_call

from gpuroute.secrets import read_secret_file

# what a subcommand asks the admin API: method, path, JSON body
Call = tuple[str, str, dict | None]


class _Commands:
    """One level of subcommands; each leaf takes the common options and says its call."""

    def __init__(self, parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
        self.prog = parser.prog.removeprefix("gpuroute ")  # "admin", "admin keys"
        dest = self.prog.replace(" ", "_") + "_command"
        self.sub = parser.add_subparsers(dest=dest, required=True, metavar="COMMAND")
        self.common = common

    def group(self, name: str, help: str) -> _Commands:
        return _Commands(self.sub.add_parser(name, help=help), self.common)

    def leaf(
        self,
        name: str,
        help: str,
        request: Callable[[argparse.Namespace], Call],
        shown: Callable[[Any], str],
    ) -> argparse.ArgumentParser:
        parser = self.sub.add_parser(name, help=help, parents=[self.common])
        parser.set_defaults(request=request, show=shown, what=f"{self.prog} {name}")
        return parser


def register(sub) -> None:
    admin = sub.add_parser(
        "admin", help="operate a running router: reload, backends, API keys, splits, its config"
    )
    common = argparse.ArgumentParser(add_help=False)
    add_arguments(common)
    common.add_argument("--json", action="store_true", help="print the API's answer as JSON")
    commands = _Commands(admin, common)
    commands.leaf(
        "reload", "re-read the router's config file", lambda _: ("POST", "/admin/reload", None),
        show.reloaded,
    )  # fmt: skip
    commands.leaf(
        "config", "the effective config, secrets redacted (JSON)",
        lambda _: ("GET", "/admin/config", None), show.as_json,
    )  # fmt: skip
    _register_backends(
        commands.group("backends", help="list, add, drain, undrain, remove backends")
    )
    _register_keys(commands.group("keys", help="list, add, revoke API keys"))
    _register_splits(commands.group("splits", help="each model's split; set one's weights"))
    admin.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    shown = show.as_json if args.json else args.show
    return run_call(args, args.what, args.request(args), lambda answer: print(shown(answer)))


def _fields(args: argparse.Namespace) -> dict:
    """The body: the fields the leaf declared, as given (unset ones left to the API)."""
    return {f: getattr(args, f) for f in args.fields if getattr(args, f) is not None}


def _declare(parser: argparse.ArgumentParser, *fields: argparse.Action) -> None:
    parser.set_defaults(fields=tuple(f.dest for f in fields))


def _register_backends(commands: _Commands) -> None:
    commands.leaf(
        "list", "every backend: state, in flight, why", lambda _: ("GET", "/admin/backends", None),
        show.backends,
    )  # fmt: skip
    add = commands.leaf(
        "add", "add a static backend (as a [[backends]] entry; it joins warming)",
        lambda a: ("POST", "/admin/backends", _fields(a)), show.backend_added,
    )  # fmt: skip
    _declare(
        add,
        add.add_argument("--url", required=True, help="the engine's base URL"),
        add.add_argument("--gpu", required=True, help="its GPU type (H100, L4, ...)"),
        add.add_argument("--models", required=True, nargs="+", metavar="MODEL"),
        add.add_argument("--id", help="its id (default: host:port of --url)"),
        add.add_argument("--capacity", type=float, help="default: from the GPU type"),
        add.add_argument("--max-inflight", type=int, help="beyond this the router queues"),
        add.add_argument("--tensor-parallel", type=int, metavar="N"),
        add.add_argument("--pipeline-parallel", type=int, metavar="N"),
        add.add_argument("--lora-adapters", nargs="+", metavar="MODEL", help="which of --models"),
    )
    for name, action in (
        ("drain", "nothing new to it; its requests finish (kept across reloads)"),
        ("undrain", "back into rotation after a drain, warming"),
        ("remove", "drain it, then drop it once idle"),
    ):
        one = commands.leaf(name, action, _on_backend(name), show.drained)
        one.add_argument("backend_id", metavar="ID", help="a static backend's id")


def _on_backend(action: str) -> Callable[[argparse.Namespace], Call]:
    def request(args: argparse.Namespace) -> Call:
        path = f"/admin/backends/{quote(args.backend_id, safe='')}"
        return ("DELETE", path, None) if action == "remove" else ("POST", f"{path}/{action}", None)

    return request


def _register_keys(commands: _Commands) -> None:
    commands.leaf(
        "list", "keys in force and revoked digests", lambda _: ("GET", "/admin/keys", None),
        show.keys,
    )  # fmt: skip
    add = commands.leaf(
        "add", "add an API key with its tenant and quotas (only its sha256 is sent)",
        _add_key, show.key_added,
    )  # fmt: skip
    _key_arguments(add)
    _declare(
        add,
        add.add_argument("--tenant", required=True),
        add.add_argument("--priority", help="the key's class: its default and the most it asks"),
        add.add_argument("--requests-per-minute", type=float, metavar="N"),
        add.add_argument("--tokens-per-minute", type=float, metavar="N"),
        add.add_argument("--residency", nargs="+", metavar="PLACE", help="regions/jurisdictions"),
        add.add_argument("--max-in-flight", type=int, metavar="N"),
        add.add_argument("--slo-class", help="its default and most demanding SLO class"),
        add.add_argument("--models", nargs="+", metavar="MODEL", help="the models it may use"),
        add.add_argument(
            "--allow-body-fields", nargs="+", metavar="FIELD",
            help="router-only body fields it may send (cache_salt, ...)",
        ),
    )  # fmt: skip
    revoke = commands.leaf("revoke", "revoke a key (also one the file lists)", _revoke_key,
                           show.key_revoked)  # fmt: skip
    _key_arguments(revoke)


def _key_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--sha256", metavar="HEX", help="the key's sha256 (lowercase hex)")
    which.add_argument(
        "--key-file", metavar="FILE", help='the key itself, one line ("-": stdin), hashed here'
    )


def _digest(args: argparse.Namespace) -> str:
    if args.sha256 is not None:
        return args.sha256
    from gpuroute.auth import key_digest

    return key_digest(_read_key(args.key_file, args.what))


def _read_key(path: str, what: str) -> str:
    """The key from a file (read_secret_file), or from stdin for `-` (not echoed on a
    terminal)."""
    if path != "-":
        return read_secret_file(path, "--key-file")
    key = getpass.getpass("API key: ") if sys.stdin.isatty() else sys.stdin.read()
    if not (key := key.rstrip("\r\n")):
        raise SystemExit(f"gpuroute {what}: --key-file: {path} holds no key")
    return key


def _add_key(args: argparse.Namespace) -> Call:
    return "POST", "/admin/keys", {"sha256": _digest(args), **_fields(args)}


def _revoke_key(args: argparse.Namespace) -> Call:
    return "DELETE", f"/admin/keys/{quote(_digest(args), safe='')}", None


def _register_splits(commands: _Commands) -> None:
    commands.leaf(
        "list", "each [[models]] name's split, fallbacks and aliases",
        lambda _: ("GET", "/admin/models", None), show.splits,
    )  # fmt: skip
    put = commands.leaf("set", "new weights for a model's versions", _set_split, show.split_set)
    put.add_argument("model", metavar="MODEL")
    put.add_argument(
        "weights", nargs="+", metavar="VERSION=PERCENT", type=_weight,
        help="every version's weight, adding up to 100",
    )  # fmt: skip


def _weight(text: str) -> tuple[str, float]:
    version, sep, percent = text.rpartition("=")
    try:
        if sep and version:
            return version, float(percent)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected VERSION=PERCENT, got {text!r}")


def _set_split(args: argparse.Namespace) -> Call:
    path = f"/admin/models/{quote(args.model, safe='')}/split"
    return "PUT", path, {"split": dict(args.weights)}
