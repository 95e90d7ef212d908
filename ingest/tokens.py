"""Bearer tokens from a file, kept as SHA-256 digests: the read API's and the daemon's /metrics.

Tokens are long random strings (at least ``MIN_TOKEN_CHARS`` characters;
``secrets.token_urlsafe(32)`` gives 43), so a fast hash is enough: a slow password KDF
defends guessable secrets, and nobody guesses 256 random bits. A presented token is
hashed and compared with every digest by ``hmac.compare_digest``, without stopping at a
match, so the time taken says neither whether nor which one matched. Only names ever
reach logs.
"""

from __future__ import annotations

import hashlib
import hmac
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ingest.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(frozen=True, slots=True)
class ApiToken:
    """A token as kept in memory: its name and the SHA-256 digest of its text."""

    name: str
    sha256: bytes = field(repr=False)


MIN_TOKEN_CHARS = 16
MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))' > tokens"


def digest(token: str) -> bytes:
    """The SHA-256 digest of a token (what is kept in memory)."""
    return hashlib.sha256(token.encode()).digest()


def read_tokens(path: str, flag: str = "--api-tokens-file") -> tuple[ApiToken, ...]:
    """The tokens of a file, as names and digests.

    A TOML table of ``name = "token"`` (optionally under ``[tokens]``), or one token per
    line (named ``line-<n>``; ``#`` comments and blank lines skipped). A Docker or
    Kubernetes secret file works as it is.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag}: cannot read {path} ({exc})") from None
    pairs = _toml_pairs(text, flag)
    if pairs is None:
        pairs = [
            (f"line-{n}", line.strip())
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.strip().startswith("#")
        ]
    if not pairs:
        raise ConfigError(f"{flag}: {path} holds no token; make one with {MAKE_ONE}")
    tokens: list[ApiToken] = []
    for name, token in pairs:
        if len(token) < MIN_TOKEN_CHARS or any(c.isspace() or c in "\"'" for c in token):
            raise ConfigError(
                f"{flag}: the token {name} of {path} is shorter than "
                f"{MIN_TOKEN_CHARS} characters or holds spaces or quotes; make "
                f"one with {MAKE_ONE}"
            )
        tokens.append(ApiToken(name, digest(token)))
    if len({t.sha256 for t in tokens}) < len(tokens):
        raise ConfigError(f"{flag}: {path} holds the same token twice (under two names)")
    return tuple(tokens)


def _toml_pairs(text: str, flag: str) -> list[tuple[str, str]] | None:
    """``name = "token"`` pairs when the text is TOML, else None (a file of lines)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    table = data["tokens"] if set(data) == {"tokens"} and isinstance(data["tokens"], dict) else data
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ConfigError(
            f'{flag}: a TOML tokens file holds name = "token" pairs '
            "(optionally under [tokens]), nothing else"
        )
    return list(table.items())


class TokenSet:
    """The accepted tokens' digests, and the check of a presented token."""

    def __init__(self, tokens: Sequence[ApiToken]) -> None:
        self._tokens = tuple(tokens)

    def __bool__(self) -> bool:
        return bool(self._tokens)

    @property
    def names(self) -> list[str]:
        """The tokens' names (for the log at start)."""
        return [t.name for t in self._tokens]

    def name_of(self, token: str) -> str | None:
        """The name of ``token`` when accepted; every digest is compared (no early exit)."""
        presented = digest(token)
        found: str | None = None
        for entry in self._tokens:
            if hmac.compare_digest(presented, entry.sha256):
                found = entry.name
        return found
