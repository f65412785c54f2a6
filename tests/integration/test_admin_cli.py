"""`gpuroute admin` (issue 34 item 5) as an operator runs it, against a router process behind
an admin token in front of fake engines: a reload picks up the edited file (a bad one is
refused with the router's message); a backend added serves, then drains and goes; a key
added is let in, and refused with 401 once revoked; the config it prints hides the
secrets; a wrong or missing token, or no listener at all, fails with the reason."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from gpuroute.testbed.loopback import TESTBED_ROUTER
from support.live import (
    MODEL,
    FakeEngineProcess,
    chat_body,
    environ_without_proxies,
    free_port,
    gpuroute_cmd,
    http_ok,
    wait_for,
)

from gpuroute.auth import key_digest

TOKEN = "admin-secret-1"
SECRETS = (TOKEN, "engine-secret-2", "decision-secret-3")
FILE_KEY = "sk-in-the-file"
OTHER = "other-model"  # served only by the engine the tests add


@dataclass
class Fleet:
    path: Path  # the router's config
    text: str  # as the router started with it
    public: str
    admin: str
    token_file: Path
    other_engine: str  # serves OTHER; not in the file

    def cli(self, *args: str, token: Path | None = None, **run) -> subprocess.CompletedProcess:
        """`gpuroute admin ARGS` at this router's admin listener, with the admin token."""
        where = ("--admin-url", self.admin, "--token-file", str(token or self.token_file))
        return cli(*args, *where, **run)


def cli(*args: str, env: dict | None = None, input: str | None = None):
    environ = {k: v for k, v in environ_without_proxies().items() if k != "GPUROUTE_ADMIN_TOKEN"}
    return subprocess.run(
        gpuroute_cmd("admin", *args), capture_output=True, text=True, input=input,
        env=environ | (env or {}), timeout=60,
    )  # fmt: skip


def router_text(engine: str, port: int, admin_port: int, top: str) -> str:
    return (
        TESTBED_ROUTER + top + 'engine_api_key = "engine-secret-2"\ntick_s = 0.05\n'
        f"[listen]\nport = {port}\n[admin_listen]\nport = {admin_port}\n"
        '[region]\nname = "local"\njurisdiction = "local"\ndecision_key = "decision-secret-3"\n'
        f'[auth]\n[[auth.keys]]\nsha256 = "{key_digest(FILE_KEY)}"\ntenant = "file"\n'
        f'[[backends]]\nid = "first"\nurl = "{engine}"\ngpu = "L4"\n'
        f'models = ["{MODEL}", "m@v1", "m@v2"]\n'
        '[[models]]\nname = "m"\nsplit = {"m@v1" = 100, "m@v2" = 0}\n'
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("admin_cli")
    token_file = tmp / "admin.token"
    token_file.write_text(TOKEN + "\n")
    with contextlib.ExitStack() as stack:
        engine = FakeEngineProcess("L4")
        stack.callback(engine.stop)
        other = FakeEngineProcess("L4", extra=("--served-name", OTHER))
        stack.callback(other.stop)
        port, admin_port = free_port(), free_port()
        text = router_text(engine.url, port, admin_port, f'admin_token_file = "{token_file}"\n')
        path = tmp / "router.toml"
        path.write_text(text)
        admin = f"http://127.0.0.1:{admin_port}"
        stack.enter_context(router_process(path, admin + "/readyz"))
        yield Fleet(path, text, f"http://127.0.0.1:{port}", admin, token_file, other.url)


@contextlib.contextmanager
def router_process(path: Path, ready: str) -> Iterator[None]:
    """`gpuroute router --config PATH`, once `ready` answers 200; its log beside the file."""
    log_path = path.with_suffix(".log")
    with log_path.open("wb") as log:
        router = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(path)), stdout=log, stderr=log
        )
    try:
        wait_for(lambda: router.poll() is not None or http_ok(ready), 30, "the router")
        assert router.poll() is None, log_path.read_text()[-2000:]
        yield
    finally:
        router.terminate()
        router.wait(30)


def ask(fleet: Fleet, key: str = FILE_KEY, model: str = MODEL) -> tuple[int, str]:
    """A chat request to the public port: its status and the backend that served it."""
    body = json.dumps(chat_body(max_tokens=2) | {"model": model}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    request = urllib.request.Request(fleet.public + "/v1/chat/completions", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, answer.headers.get("x-gpuroute-backend", "")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def listed(fleet: Fleet, *what: str) -> dict:
    shown = fleet.cli(*what, "list", "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_reload_picks_up_the_edited_file_and_refuses_a_bad_one(fleet: Fleet) -> None:
    fleet.path.write_text('policy = "round_robin"\n' + fleet.text)
    try:
        done = cli("reload", "--config", str(fleet.path))  # listener and token from the file
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"reloaded {fleet.path}: policy round_robin")
        assert json.loads(fleet.cli("config").stdout)["policy"] == "round_robin"
        fleet.path.write_text("policy = [\n" + fleet.text)
        refused = fleet.cli("reload")
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.startswith("gpuroute admin reload: 400: ")
        assert str(fleet.path) in refused.stderr
        assert json.loads(fleet.cli("config").stdout)["policy"] == "round_robin"  # it stays
    finally:
        fleet.path.write_text(fleet.text)
        assert fleet.cli("reload").returncode == 0


def test_the_config_shown_hides_every_secret(fleet: Fleet) -> None:
    shown, raw = fleet.cli("config"), fleet.cli("config", "--json")
    assert shown.returncode == 0, shown.stderr
    config = json.loads(shown.stdout)
    assert config == json.loads(raw.stdout)
    assert config["engine_api_key"] == "<redacted>"
    assert config["region"]["decision_key"] == "<redacted>"
    assert config["admin_token_file"] == str(fleet.token_file)  # where it is, not what
    for secret in SECRETS:
        assert secret not in shown.stdout + shown.stderr


def test_a_backend_added_serves_then_drains_and_goes(fleet: Fleet) -> None:
    added = fleet.cli(
        "backends", "add", "--id", "extra", "--url", fleet.other_engine, "--gpu", "L4",
        "--models", OTHER, "--max-inflight", "8",
    )  # fmt: skip
    assert (added.returncode, added.stdout) == (0, "added backend extra (it joins warming)\n")
    table = fleet.cli("backends", "list").stdout.splitlines()
    assert table[1].split()[:3] == ["ID", "GPU", "STATE"]
    assert any(line.split()[:2] == ["extra", "L4"] for line in table), table
    assert ask(fleet, model=OTHER) == (200, "extra")

    drained = fleet.cli("backends", "drain", "extra")
    assert drained.stdout == "extra: draining, 0 in flight\n", drained.stderr
    rows = {row["id"]: row for row in listed(fleet, "backends")["backends"]}
    assert rows["extra"]["state"] == "draining"
    assert ask(fleet, model=OTHER)[0] == 503  # its only backend takes nothing new
    undrained = fleet.cli("backends", "undrain", "extra")
    assert undrained.stdout == "extra: warming, 0 in flight\n", undrained.stderr
    assert ask(fleet, model=OTHER) == (200, "extra")  # back in rotation

    removed = fleet.cli("backends", "remove", "extra")
    assert removed.stdout == "extra: removing, 0 in flight, dropped once idle\n", removed.stderr
    wait_for(
        lambda: "extra" not in {row["id"] for row in listed(fleet, "backends")["backends"]},
        10, "the removed backend dropped",
    )  # fmt: skip
    again = fleet.cli("backends", "remove", "extra")
    assert again.returncode == 1
    assert again.stderr.startswith("gpuroute admin backends remove: 404: no static backend")
    gone = fleet.cli("backends", "undrain", "extra")
    assert gone.returncode == 1 and "404: no static backend 'extra' to undrain" in gone.stderr
    bad = fleet.cli(
        "backends", "add", "--url", fleet.other_engine, "--gpu", "Z9", "--models", OTHER
    )
    assert bad.returncode == 1 and "400: " in bad.stderr and "Z9" in bad.stderr


def test_an_operators_drain_survives_a_reload_until_undrained(fleet: Fleet) -> None:
    """The file decides which backends exist; a drain asked for at run time is the
    operator's and stays through reloads (one for a key or a policy must not put a host
    under maintenance back into rotation) until `undrain`."""
    (file_backend,) = [row["id"] for row in listed(fleet, "backends")["backends"]]
    assert fleet.cli("backends", "drain", file_backend).returncode == 0
    assert ask(fleet)[0] == 503
    assert fleet.cli("reload").returncode == 0
    rows = {row["id"]: row for row in listed(fleet, "backends")["backends"]}
    assert rows[file_backend]["state"] == "draining"  # kept through the reload
    assert ask(fleet)[0] == 503
    undrained = fleet.cli("backends", "undrain", file_backend)
    assert undrained.returncode == 0, undrained.stderr
    assert ask(fleet) == (200, file_backend)


def test_a_key_added_is_let_in_and_refused_once_revoked(fleet: Fleet, tmp_path) -> None:
    key, other_key = "sk-added-by-cli", "sk-added-by-digest"
    (tmp_path / "key").write_text(key + "\n")
    added = fleet.cli("keys", "add", "--key-file", str(tmp_path / "key"), "--tenant", "cli",
                      "--requests-per-minute", "600")  # fmt: skip
    assert added.stdout == f"added key {key_digest(key)} for tenant cli\n", added.stderr
    assert ask(fleet, key)[0] == 200
    by_digest = fleet.cli("keys", "add", "--sha256", key_digest(other_key), "--tenant", "two")
    assert by_digest.returncode == 0, by_digest.stderr
    assert ask(fleet, other_key)[0] == 200

    shown = fleet.cli("keys", "list")
    rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines()}
    assert rows[key_digest(key)][1:3] == ["cli", "admin"]
    assert "requests_per_minute=600.0" in rows[key_digest(key)]
    assert rows[key_digest(FILE_KEY)][1:3] == ["file", "file"]
    assert key not in shown.stdout and other_key not in shown.stdout

    revoked = fleet.cli("keys", "revoke", "--key-file", str(tmp_path / "key"))
    assert revoked.stdout == f"revoked key {key_digest(key)}\n", revoked.stderr
    assert ask(fleet, key)[0] == 401
    from_stdin = fleet.cli("keys", "revoke", "--key-file", "-", input=other_key + "\n")
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert ask(fleet, other_key)[0] == 401
    keys = listed(fleet, "keys")["keys"]
    assert {"sha256": key_digest(key), "revoked": True, "in_file": False} in keys
    assert ask(fleet)[0] == 200  # the file's key is untouched


def test_a_split_set_takes_effect(fleet: Fleet) -> None:
    done = fleet.cli("splits", "set", "m", "m@v1=70", "m@v2=30")
    assert done.stdout == "m: m@v1 70%, m@v2 30%\n", done.stderr
    assert fleet.cli("splits", "list").stdout.splitlines() == ["m: m@v1 70%, m@v2 30%"]
    refused = fleet.cli("splits", "set", "m", "m@v1=70")
    assert refused.returncode == 1 and refused.stderr.startswith("gpuroute admin splits set: 400: ")


def test_a_wrong_or_missing_token_fails_with_the_servers_message(fleet, tmp_path) -> None:
    (tmp_path / "wrong").write_text("guessed\n")
    wrong = fleet.cli("keys", "list", token=tmp_path / "wrong")
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr == "gpuroute admin keys list: 401: admin token required\n"
    missing = cli("config", "--admin-url", fleet.admin)
    assert missing.returncode == 1
    assert "401: admin token required (no admin token given: --token-file" in missing.stderr
    by_env = cli("config", "--admin-url", fleet.admin, env={"GPUROUTE_ADMIN_TOKEN": TOKEN})
    assert by_env.returncode == 0, by_env.stderr
    unreadable = fleet.cli("config", token=tmp_path / "absent")
    assert unreadable.returncode == 2 and "--token-file: cannot read" in unreadable.stderr
    for result in (wrong, missing, by_env, unreadable):
        assert TOKEN not in result.stdout + result.stderr


def test_no_listener_is_named_in_the_error() -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    failed = cli("backends", "list", "--admin-url", nowhere)
    assert failed.returncode == 1
    assert failed.stderr.startswith(f"gpuroute admin backends list: cannot reach {nowhere}: ")


def test_without_an_admin_token_the_loopback_listener_answers_anyone(tmp_path) -> None:
    """No admin token configured: the admin listener must be on loopback, and asks for none."""
    port, admin_port = free_port(), free_port()
    path = tmp_path / "router.toml"
    path.write_text(router_text("http://127.0.0.1:9", port, admin_port, top=""))
    # /healthz: its one backend is nowhere, so it is never ready
    with router_process(path, f"http://127.0.0.1:{admin_port}/healthz"):
        shown = cli("backends", "list", "--config", str(path))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[2].split()[:2] == ["first", "L4"]


class Recorder(BaseHTTPRequestHandler):
    """An admin listener that keeps what it was sent and answers as the router does."""

    seen: ClassVar[list[tuple[str, str | None, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.seen.append((self.path, self.headers.get("Authorization"), body))
        answer = json.dumps({"added": json.loads(body)["sha256"], "tenant": "t"}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_args) -> None:
        pass


def test_only_the_keys_digest_travels(tmp_path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "key").write_text("sk-never-sent\n")
        (tmp_path / "token").write_text(TOKEN)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        done = cli("keys", "add", "--key-file", str(tmp_path / "key"), "--tenant", "t",
                   "--admin-url", url, "--token-file", str(tmp_path / "token"))  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    ((path, authorization, body),) = Recorder.seen
    assert (path, authorization) == ("/admin/keys", f"Bearer {TOKEN}")
    assert json.loads(body) == {"sha256": key_digest("sk-never-sent"), "tenant": "t"}
