"""Device accounts in a mosquitto password file: ``ingest device-account``.

One account per device, so that the broker's ACL can bind a device to its own topics
(``pattern write sensors/%u/#`` in deploy/mosquitto/acl): a device that knows only its own
password can publish only as itself. A line of the file is ``name:$7$<iterations>$<salt>$<hash>``,
mosquitto's own PBKDF2-HMAC-SHA512 form (what ``mosquitto_passwd`` writes), so the file
needs no mosquitto tools on the machine that manages it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
from typing import TYPE_CHECKING

from ingest.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

ITERATIONS = 101  # mosquitto_passwd's own default for $7$
SALT_BYTES = 12  # as mosquitto_passwd
# A device name becomes a topic level through %u: no wildcard, no separator, no control
# character, and not so long that topics get unwieldy.
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
NAME_RULE = "1 to 64 letters, digits, '_', '.', ':' or '-'"
MIN_PASSWORD = 16  # characters of a password given by the user


def password_hash(password: str, salt: bytes | None = None) -> str:
    """Mosquitto's ``$7$`` hash of ``password`` (PBKDF2-HMAC-SHA512)."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, ITERATIONS)
    return f"$7${ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def new_password() -> str:
    """A random password for a device (256 bits, URL- and shell-safe)."""
    return secrets.token_urlsafe(32)


def set_account(passwd: Path, name: str, password: str) -> bool:
    """Add ``name`` to the password file, or replace its password; True if it was new.

    The file is rewritten whole (a temporary file renamed over it) and kept private
    (0600): it holds every account's hash.
    """
    if not NAME.fullmatch(name):
        raise ConfigError(f"device name {name[:80]!r}: {NAME_RULE}")
    if len(password) < MIN_PASSWORD:
        raise ConfigError(f"--password-file: at least {MIN_PASSWORD} characters")
    try:
        lines = passwd.read_text(encoding="utf-8").splitlines() if passwd.exists() else []
    except OSError as exc:
        raise ConfigError(f"--passwd: cannot read {passwd}: {exc.strerror}") from None
    entry = f"{name}:{password_hash(password)}"
    kept = [line for line in lines if line.split(":", 1)[0] != name]
    new = len(kept) == len(lines)
    temporary = passwd.with_name(passwd.name + ".tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("\n".join([*kept, entry]) + "\n")
        temporary.replace(passwd)
    except OSError as exc:
        raise ConfigError(f"--passwd: cannot write {passwd}: {exc.strerror}") from None
    return new
