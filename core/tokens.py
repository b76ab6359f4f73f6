"""API tokens: made once, shown once, kept only as a salted scrypt hash.

A token reads `mxq_<id>_<secret>`: the id (12 hex digits, stored in clear) finds the user's row
without a scan, the secret (32 random bytes, URL-safe base64) is checked against the stored hash
in constant time. scrypt (RFC 7914, in Python's hashlib) costs about 16 MiB and tens of
milliseconds per check, so a stolen table does not give tokens back; the API keeps a check it
already made in memory (`mxq.api.auth`), so a script's every request does not pay it again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

PREFIX = "mxq_"
# scrypt's cost: N (CPU and memory), r (block size), p (parallelism): OWASP's minimum for scrypt.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
_TOKEN = re.compile(r"^mxq_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 1024 * 1024, dklen=32)


def issue() -> tuple[str, str, str]:
    """A fresh token: (its id, the token to show once, the hash to store)."""
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return token_id, f"{PREFIX}{token_id}_{secret}", hash_secret(secret)


def parse(token: str) -> tuple[str, str] | None:
    """(token id, secret) of a well-formed token; None for anything else."""
    found = _TOKEN.match(token)
    return (found.group(1), found.group(2)) if found else None


def hash_secret(secret: str) -> str:
    """`scrypt$N$r$p$salt$hash` (base64), with a fresh 16-byte salt."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(secret, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def verify(secret: str, stored: str) -> bool:
    """The secret is the one `stored` was made from (compared in constant time)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        given = _scrypt(secret, base64.b64decode(salt), int(n), int(r), int(p))
        return hmac.compare_digest(given, base64.b64decode(digest))
    except (ValueError, TypeError):
        return False


def fingerprint(token: str) -> str:
    """A SHA-256 of the whole token: what a cache of checks made may hold instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()
