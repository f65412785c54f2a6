"""TLS contexts for listeners (server side) and for the connections tiers open to each other
(client side), built from file paths in config; every failure names the file."""

from __future__ import annotations

import ssl

from gpuroute.config import ConfigError, StrictModel, TlsConfig


class ClientTlsConfig(StrictModel):
    """How a tier connects to the next one over https: whom to trust (`ca_file`; unset: the
    system's roots) and, for mutual TLS, its own certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def server_context(tls: TlsConfig | None, where: str) -> ssl.SSLContext | None:
    """A listener's context (None: plaintext); with a client CA, a client without a valid
    certificate fails the handshake (mutual TLS)."""
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, tls.cert_file, tls.key_file, where)
    if tls.client_ca_file is not None:
        _load_ca(context, tls.client_ca_file, where)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(tls: ClientTlsConfig, where: str) -> ssl.SSLContext:
    """Verifies the server's certificate and name always; presents ours when configured."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.ca_file is not None:
        _load_ca(context, tls.ca_file, where)
    if (tls.cert_file is None) != (tls.key_file is None):
        raise ConfigError(f"{where}: set both cert_file and key_file, or neither")
    if tls.cert_file is not None and tls.key_file is not None:
        _load_chain(context, tls.cert_file, tls.key_file, where)
    return context


def _load_chain(context: ssl.SSLContext, cert: str, key: str, where: str) -> None:
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{where}: cannot load cert_file {cert} / key_file {key}: {exc}"
        ) from None


def _load_ca(context: ssl.SSLContext, ca: str, where: str) -> None:
    try:
        context.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}: cannot load CA file {ca}: {exc}") from None
