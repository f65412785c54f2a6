"""A throwaway certificate authority made with the `openssl` command (Debian's), for the
demo, the benchmarks and the tests to run with TLS and mutual TLS on one machine.
Certificates are valid for a day, for 127.0.0.1, localhost and any addresses asked for."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpuroute.testbed.processes import StartError, require

EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    done = subprocess.run([require("openssl"), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise StartError(f"openssl {args[0]} failed: {done.stderr.strip()}")


class LocalCA:
    def __init__(self, workdir: Path, name: str = "local-ca") -> None:
        self.dir = workdir / "tls" / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_file, self.ca_key = self.dir / "ca.crt", self.dir / "ca.key"
        _openssl("req", "-x509", *EC_KEY, "-days", "1", "-subj", f"/CN=gpuroute {name}",
                 "-keyout", str(self.ca_key), "-out", str(self.ca_file))  # fmt: skip

    def issue(
        self, name: str, *, client: bool = False, ips: tuple[str, ...] = ()
    ) -> tuple[Path, Path]:
        """(cert_file, key_file) signed by this CA, for a server or (client) a caller."""
        cert, key, csr = (self.dir / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
        ext = self.dir / f"{name}.ext"
        usage = "clientAuth" if client else "serverAuth"
        names = ",".join(f"IP:{ip}" for ip in ("127.0.0.1", *ips)) + ",DNS:localhost"
        ext.write_text(f"subjectAltName={names}\nextendedKeyUsage={usage}\n")
        _openssl("req", "-new", *EC_KEY, "-subj", f"/CN={name}", "-keyout", str(key),
                 "-out", str(csr))  # fmt: skip
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca_file), "-CAkey",
                 str(self.ca_key), "-CAcreateserial", "-days", "1", "-extfile", str(ext),
                 "-out", str(cert))  # fmt: skip
        return cert, key

    def server_section(self, name: str, ips: tuple[str, ...] = ()) -> str:
        """A listener's `[...tls]` body: its certificate, and only callers this CA signed."""
        cert, key = self.issue(name, ips=ips)
        return f'cert_file = "{cert}"\nkey_file = "{key}"\nclient_ca_file = "{self.ca_file}"\n'

    def client_section(self, name: str) -> str:
        """A client's `[...tls]` body: trust this CA, present our own certificate."""
        cert, key = self.issue(name, client=True)
        return f'ca_file = "{self.ca_file}"\ncert_file = "{cert}"\nkey_file = "{key}"\n'
