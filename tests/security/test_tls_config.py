"""Certificates named in config are loaded before anything starts (issue 16 item 7)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support_security import secure_toml


@pytest.mark.parametrize("what", ["listen.tls", "engine_tls", "region.report_listen.tls"])
def test_a_missing_certificate_is_a_config_error_naming_file_and_key(tmp_path, what) -> None:
    """Certificates are loaded before anything starts: a bad path ends the process with exit
    2 and one line naming the config file and the key, not a traceback from inside the loop
    (or, for a gRPC link, a stream task that dies without a word)."""
    missing = f'cert_file = "{tmp_path}/none.crt"\nkey_file = "{tmp_path}/none.key"'
    sections = {
        "listen.tls": f"[listen.tls]\n{missing}",
        "engine_tls": f"[engine_tls]\n{missing}",
        "region.report_listen.tls": (
            f'[region]\nname = "eu-west"\n[region.report_listen]\nport = 0\n'
            f"[region.report_listen.tls]\n{missing}"
        ),
    }
    path = tmp_path / "router.toml"
    path.write_text(secure_toml("http://127.0.0.1:9") + sections[what] + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpuroute.cli", "router", "--config", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"{path}: {what}" in done.stderr and f"{tmp_path}/none." in done.stderr
    assert "Traceback" not in done.stderr
