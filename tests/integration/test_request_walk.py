"""The walk of one streamed chat whose engine dies mid-answer (scripts/request-walk.py): the
attempt runner (router/attempts/forward.py) runs the continuation as one more attempt, and the
continuer only gives verdicts, so no call goes back into either from under the other."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from pathlib import Path

from support.paths import REPO


def walk_script():
    spec = importlib.util.spec_from_file_location("request_walk", REPO / "scripts/request-walk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_continued_stream_never_calls_back_between_runner_and_continuer(tmp_path: Path) -> None:
    script = walk_script()
    logging.disable(logging.WARNING)  # the broken streams' warnings
    try:
        with script.EngineThread(broken=True) as engines:
            walk = asyncio.run(script.measure(tmp_path, engines.urls))
    finally:
        logging.disable(logging.NOTSET)
    figures = walk.figures()
    crossed = {module for module, _ in walk.functions}
    assert {
        "gpuroute.router.attempts.forward",
        "gpuroute.router.attempts.stream_continuer",
    } <= crossed
    cycles = [pair for pair in figures["callbacks_by_pair"] if "stream_continuer" in pair]
    assert not cycles, figures["callbacks_by_pair"]
