"""Starting a grpc.aio server the way every gpuroute stream service wants it (one port of its
own, no SO_REUSEPORT sharing, a busy port reported as an OSError naming it), and opening a
channel to one: both with TLS, and mutual TLS, when configured."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from gpuroute.config import ConfigError, TlsConfig
from gpuroute.tls import ClientTlsConfig


def _read(path: str | None, where: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None


def server_credentials(tls: TlsConfig | None, where: str) -> grpc.ServerCredentials | None:
    """None: plaintext. With `client_ca_file`, a client must present a certificate that CA
    signed. Built once, at construction, so a bad file is a config error at start-up."""
    if tls is None:
        return None
    pair = (_read(tls.key_file, where), _read(tls.cert_file, where))
    ca = _read(tls.client_ca_file, where)
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=bool(ca))


def channel_credentials(tls: ClientTlsConfig | None, where: str) -> grpc.ChannelCredentials | None:
    """None: plaintext; else verify the server against `ca_file` and present our certificate
    when one is configured (mutual TLS)."""
    if tls is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, where),
        private_key=_read(tls.key_file, where),
        certificate_chain=_read(tls.cert_file, where),
    )


async def start_grpc_server(
    add_servicer: Callable[[grpc.aio.Server], None],
    host: str,
    port: int,
    what: str,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start a server with the servicer `add_servicer` registers; returns it and its port."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    add_servicer(server)
    address = f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # grpc reports a busy port this way
        raise OSError(f"{what}: cannot listen on {host}:{port} (in use?)") from exc
    await server.start()
    return server, bound


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, object]] = (),
) -> grpc.aio.Channel:
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(address, credentials, options=list(options))
