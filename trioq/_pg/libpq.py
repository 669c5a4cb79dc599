"""The libpq settings every trioq connection gets, the producers' too (no trio, no psycopg)."""

from __future__ import annotations

import os
from typing import Any

# Where trioq (app, CLI, producers) reads the database URL when none is given.
DATABASE_URL_ENV = "TRIOQ_DATABASE_URL"

# libpq parameters trioq sets unless the conninfo (or the matching PG* environment variable)
# already does. Keepalives and tcp_user_timeout bound how long a worker thread can stay blocked on
# a dead network; libpq ignores them for Unix sockets.
_LIBPQ_DEFAULTS: dict[str, tuple[str, str]] = {
    "connect_timeout": ("PGCONNECT_TIMEOUT", "10"),
    "keepalives": ("", "1"),
    "keepalives_idle": ("", "10"),
    "keepalives_interval": ("", "5"),
    "keepalives_count": ("", "3"),
    "tcp_user_timeout": ("", "30000"),
}


def network_defaults(params: dict[str, Any]) -> dict[str, str]:
    """trioq's keepalive, tcp_user_timeout and connect_timeout settings that the libpq
    parameters `params` (and the PG* environment) leave unset; the producers use them too."""
    return {
        key: value
        for key, (env_var, value) in _LIBPQ_DEFAULTS.items()
        if key not in params and not (env_var and os.environ.get(env_var))
    }
