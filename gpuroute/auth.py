"""The one parser of `Authorization: Bearer <key>` that both HTTP tiers use.

Both tiers must read a header the same way: when the global tier and a router disagree on
what a key is (one matching `Bearer ` only, the other any case), the global tier's
residency rules can be walked around by a spelling the router still accepts."""

from __future__ import annotations

import hashlib

MAX_KEY_CHARS = 512
BEARER_HINT = "expected `Authorization: Bearer <key>`"


class AuthError(Exception):
    """401 for a missing, malformed or unknown key; 403 for a key that may not be served
    here; 400 for a header that is not printable ASCII (no key has such characters)."""

    def __init__(
        self, message: str, status: int = 401, code: str = "invalid_api_key", tenant: str = ""
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.code, self.tenant = message, status, code, tenant


def printable_ascii(value: str) -> bool:
    """Header values arrive decoded with surrogate escapes; anything beyond printable ASCII
    is no key, no session id and no class name of ours."""
    return value.isascii() and value.isprintable()


def bearer(header: str | None) -> str | None:
    """The key in `Authorization: Bearer <key>` (scheme in any case, RFC 9110 §11.1);
    None when the header is absent; AuthError when it is present but no bearer key."""
    if header is None:
        return None
    if not printable_ascii(header):
        raise AuthError(
            f"Authorization header has bytes that are not printable ASCII; {BEARER_HINT}",
            status=400,
            code="invalid_authorization_header",
        )
    scheme, _, key = header.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or " " in key or len(key) > MAX_KEY_CHARS:
        raise AuthError(f"malformed Authorization header; {BEARER_HINT}")
    return key


def key_digest(key: str) -> str:
    """What configs store instead of keys: the key's sha256, lowercase hex."""
    return hashlib.sha256(key.encode()).hexdigest()
