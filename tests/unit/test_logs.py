"""Logs (issue 34, item 3): JSON lines or text, the level, the request's id on every record,
and the access log's sampling rule, replayed with an injected clock and draw."""

from __future__ import annotations

import io
import json
import logging

import pytest

from gpuroute import log_flags, logs
from gpuroute.access_log import AccessLog, AccessLogConfig, Sampler
from gpuroute.request_context import REQUEST_ID


@pytest.fixture(autouse=True)
def restore_logging(monkeypatch):
    """Each test's handler and level are taken away again (pytest's own stay)."""
    for name in (log_flags.LEVEL_ENV, log_flags.FORMAT_ENV):
        monkeypatch.setenv(name, "")  # recorded, so a command's export is undone after
        monkeypatch.delenv(name)
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_json_lines_carry_time_level_logger_message_extras_and_the_request_id() -> None:
    out = io.StringIO()
    assert logs.configure("info", "json", out) == "json"
    log = logging.getLogger("gpuroute.test")
    log.info("no request yet")
    token = REQUEST_ID.set("3f2a9c0d1e4b5a67")
    try:
        log.warning("about %s", "it", extra={"tenant": "acme", "tokens": 12})
    finally:
        REQUEST_ID.reset(token)
    first, second = (json.loads(line) for line in lines(out))
    assert list(first)[:4] == ["time", "level", "logger", "message"]
    assert first["level"] == "INFO" and first["logger"] == "gpuroute.test"
    assert first["message"] == "no request yet" and "request_id" not in first
    assert first["time"].endswith("+00:00")
    assert second["message"] == "about it" and second["level"] == "WARNING"
    assert second["request_id"] == "3f2a9c0d1e4b5a67"
    assert (second["tenant"], second["tokens"]) == ("acme", 12)


def test_an_exception_is_one_json_line() -> None:
    out = io.StringIO()
    logs.configure("info", "json", out)
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("gpuroute.test").exception("failed")
    (line,) = lines(out)
    assert "ValueError: bad" in json.loads(line)["exc_info"]


def test_warning_level_hides_info() -> None:
    out = io.StringIO()
    logs.configure("warning", "json", out)
    logging.getLogger("gpuroute.test").info("hidden")
    logging.getLogger("gpuroute.access").info("hidden too")
    logging.getLogger("gpuroute.test").warning("shown")
    assert [json.loads(line)["message"] for line in lines(out)] == ["shown"]


def test_auto_is_text_on_a_terminal_and_json_elsewhere() -> None:
    terminal, pipe = Terminal(), io.StringIO()
    assert logs.configure("info", "auto", terminal) == "text"
    token = REQUEST_ID.set("abc123")
    try:
        logging.getLogger("gpuroute.test").info("hello")
    finally:
        REQUEST_ID.reset(token)
    (line,) = lines(terminal)
    assert line.endswith("INFO gpuroute.test [req abc123] hello"), line
    assert logs.configure("info", "auto", pipe) == "json"
    logging.getLogger("gpuroute.test").info("hello")
    assert json.loads(lines(pipe)[0])["message"] == "hello"
    assert lines(terminal) == [line]  # configuring again replaced the handler


def test_every_long_running_command_takes_the_flags_and_exports_them(monkeypatch) -> None:
    from gpuroute.cli import build_parser

    parser = build_parser()
    for command in (
        ["router", "--config", "r.toml"],
        ["global", "--config", "g.toml"],
        ["agent", "--config", "a.toml"],
        ["fake-engine"],
        ["demo"],
    ):
        args = parser.parse_args([*command, "--log-level", "warning", "--log-format", "text"])
        assert (args.log_level, args.log_format) == ("warning", "text"), command
        assert parser.parse_args(command).log_format == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["router", "--config", "r.toml", "--log-level", "loud"])
    logs.configure_from(parser.parse_args(["demo", "--log-level", "error"]))
    import os

    assert os.environ[log_flags.LEVEL_ENV] == "error"
    assert os.environ[log_flags.FORMAT_ENV] == "auto"
    assert logging.getLogger().level == logging.ERROR


def test_a_process_started_without_flags_reads_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(log_flags.LEVEL_ENV, "debug")
    for handler in [h for h in logging.getLogger().handlers if isinstance(h, logs._Handler)]:
        logging.getLogger().removeHandler(handler)
    logs.ensure_configured("warning")
    assert logging.getLogger().level == logging.DEBUG
    logs.configure("error", "json", io.StringIO())
    logs.ensure_configured("info")  # already set up: left alone
    assert logging.getLogger().level == logging.ERROR


# -- the access log's sampling ---------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Draws:
    """0, 1/64, ..., 63/64, 0, ...: a uniform draw, exactly spread."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> float:
        self.n += 1
        return (self.n % 64) / 64


def replay(sampler: Sampler, clock: Clock, rps: int, seconds: int) -> list[list[float]]:
    """The sample rates of the lines written in each second of `rps` evenly spaced
    requests."""
    written: list[list[float]] = []
    for _ in range(seconds):
        second = []
        for _ in range(rps):
            rate = sampler.take()
            if rate is not None:
                second.append(rate)
            clock.now += 1 / rps
        written.append(second)
    return written


def test_below_the_rate_every_request_is_written() -> None:
    clock = Clock()
    sampler = Sampler(50, clock=clock, rng=Draws())
    for second in replay(sampler, clock, 32, 5):
        assert second == [1.0] * 32


def test_above_the_rate_about_the_limit_is_written_each_carrying_its_rate() -> None:
    clock = Clock()
    sampler = Sampler(64, clock=clock, rng=Draws())
    seconds = replay(sampler, clock, 512, 6)  # (1/512 s steps: exact in binary)
    # the first second's burst: all until the count passes 64, then ever fewer
    assert 64 < len(seconds[0]) < 256
    for second in seconds[1:]:  # steady: the previous second's 512 sets 64/512
        assert len(second) == 64
        assert set(second) == {0.125}
    # summing 1/sample_rate over the lines counts the requests
    assert sum(1 / r for second in seconds[1:] for r in second) == 5 * 512


def test_after_a_quiet_spell_every_request_is_written_again() -> None:
    clock = Clock()
    sampler = Sampler(50, clock=clock, rng=Draws())
    replay(sampler, clock, 512, 3)
    clock.now += 2.5  # idle
    assert replay(sampler, clock, 16, 2) == [[1.0] * 16, [1.0] * 16]


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_access_log_writes_its_fields_unless_off_or_below_info() -> None:
    logger = logging.getLogger("gpuroute.access.test")
    capture = Capture()
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    try:
        access = AccessLog(AccessLogConfig(), logger=logger)
        rate = access.sample()
        assert rate == 1.0
        access.write({"request_id": "ab", "route": "/v1/chat/completions", "status": 200,
                      "tenant": "acme", "sample_rate": rate})  # fmt: skip
        (record,) = capture.records
        assert record.tenant == "acme" and record.status == 200
        assert record.getMessage() == "POST /v1/chat/completions 200"
        off = AccessLog(AccessLogConfig(enabled=False), logger=logger)
        assert off.sample() is None
        logger.setLevel(logging.WARNING)
        assert access.sample() is None
    finally:
        logger.removeHandler(capture)
        logger.setLevel(logging.NOTSET)


def test_a_text_line_shows_the_known_fields_after_the_message() -> None:
    terminal = Terminal()
    logs.configure("info", "text", terminal)
    fields = {"request_id": "ab12", "route": "/v1/completions", "status": 401, "tenant": None,
              "duration_ms": 1.5}  # fmt: skip
    AccessLog(AccessLogConfig()).write(fields)
    (line,) = lines(terminal)
    assert line.endswith(
        "INFO gpuroute.access [req ab12] POST /v1/completions 401 route=/v1/completions "
        "status=401 duration_ms=1.5"
    ), line


def test_the_sample_threshold_must_be_positive() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        AccessLogConfig(sample_above_rps=0)


def test_a_decision_is_a_field_of_its_line_and_the_fault_report_reads_either_format(
    tmp_path,
) -> None:
    from gpuroute.bench.fault_report import read_events
    from gpuroute.router.observe.decision_log import DecisionLog

    out = io.StringIO()
    entry = {"event": "decision", "ts": 1.0, "chosen": "b1", "stages": [{"dropped": ["b2"]}]}
    for fmt in ("json", "text"):
        logs.configure("info", fmt, out)
        DecisionLog.log(entry)
    logging.getLogger("gpuroute.router").info("not an entry {}")
    json_line, text_line, _ = out.getvalue().splitlines()
    line = json.loads(json_line)  # an object in the line, not a JSON string in its message
    assert (line["message"], line["decision"]) == ("decision", entry)
    assert text_line.endswith(' decision decision={"event":"decision","ts":1.0,"chosen":"b1",'
                              '"stages":[{"dropped":["b2"]}]}')  # fmt: skip
    (tmp_path / "router.log").write_text(out.getvalue())
    assert read_events(tmp_path / "router.log") == [entry] * 2
