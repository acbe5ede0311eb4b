"""The board's people (``board_users``): who may act from the board, each with a token of their own."""

from __future__ import annotations

import re

from loopwarden.engine.exceptions import ConfigError

_USER = re.compile(r"^[A-Za-z0-9._@-]{1,100}$")


def parse_users(text: str | None, token: str | None = None) -> dict[str, str]:
    """``board_users`` parsed: token -> user name; raises ConfigError naming the bad entry (never its token)."""
    users: dict[str, str] = {}
    for number, entry in enumerate((text or "").split(","), start=1):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, secret = entry.partition("=")
        name, secret = name.strip(), secret.strip()
        if not sep or not _USER.match(name):
            raise ConfigError(f"LOOPWARDEN_BOARD_USERS: entry {number} is not NAME=TOKEN (NAME: 1-100 chars of "
                              "[A-Za-z0-9._@-]; the entry is not shown: it may hold a token)")
        if len(secret) < 16:
            raise ConfigError(f"LOOPWARDEN_BOARD_USERS: the token of {name!r} must be at least 16 characters")
        if name in users.values():
            raise ConfigError(f"LOOPWARDEN_BOARD_USERS: user {name!r} is given twice")
        if secret in users or secret == token:
            raise ConfigError(f"LOOPWARDEN_BOARD_USERS: the token of {name!r} is another user's or LOOPWARDEN_TOKEN: "
                              "each person needs their own")
        users[secret] = name
    return users
