"""Who may see the dashboard and who may act through it.

- Authentication (`--auth basic|token`, the secret from the environment) is checked on every
  request by `AuthMiddleware`; it is required when binding anything but loopback. A failed
  login (credentials offered and wrong) is logged, one line without the credentials, and
  counted per client address (`LoginThrottle`): after 10 in a minute that address gets 429
  with Retry-After, its credentials unchecked, until the oldest failure is a minute old. The
  token cookie holds a value derived from the token (`Auth.cookie_value`), never the token, and
  is `Secure` when the request came over https.
- CSRF: a signed double-submit token. Each browser gets a random cookie (HttpOnly,
  SameSite=Strict); each form carries HMAC(server key, cookie). A forged POST from another site
  has neither the cookie (SameSite) nor a way to compute the field (the key never leaves the
  process), so it is refused with 403, as every POST is when the dashboard is not `--admin`.
- Every response carries a Content-Security-Policy allowing only the dashboard's own scripts
  and styles: even markup that escaped escaping could not run inline script.
- Host and Origin (`HostGuard`): a request whose `Host` is not a name the dashboard is served
  as is refused (400), and so is a POST whose `Origin` is another site's (403). A page whose
  name an attacker re-binds to 127.0.0.1 (DNS rebinding) is same-origin with a loopback
  dashboard as far as the browser knows, but its requests carry the attacker's name as Host.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import ipaddress
import logging
import math
import os
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import attrs

from .._core.errors import ConfigurationError

PASSWORD_ENV = "TRIOQ_DASHBOARD_PASSWORD"
USER_ENV = "TRIOQ_DASHBOARD_USER"
TOKEN_ENV = "TRIOQ_DASHBOARD_TOKEN"
CSRF_COOKIE = "trioq_csrf"
TOKEN_COOKIE = "trioq_token"
AUTH_MODES = ("basic", "token")
# Failed logins one client address may make in LOGIN_FAILURE_WINDOW seconds before its requests
# get 429: a person mistyping is far below it, a password guesser is held to 10 a minute.
LOGIN_FAILURES_ALLOWED = 10
LOGIN_FAILURE_WINDOW = 60.0
# Addresses whose failures are remembered at most (each holds at most LOGIN_FAILURES_ALLOWED
# floats): guessing from many addresses cannot grow the dashboard's memory without bound.
LOGIN_ADDRESSES_REMEMBERED = 10_000
# What the token cookie's value is derived from the token with (HMAC-SHA256, the token as key).
_COOKIE_PURPOSE = b"trioq dashboard token cookie v1"

log = logging.getLogger("trioq.dashboard")

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_name(value: str) -> str:
    """The name of a `Host` header or of an Origin's authority, without its port, lower case
    (`[::1]:8080` is `::1`)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def served_names(bind_host: str, allowed: tuple[str, ...]) -> frozenset[str] | None:
    """The Host names a dashboard bound to `bind_host` answers: the loopback names, the bound
    address itself (unless a wildcard) and the `--allowed-host` names; None when `*` is among
    them (every name: the check is off)."""
    if "*" in allowed:
        return None
    names = {*LOOPBACK_NAMES, *(host_name(name) for name in allowed)}
    if bind_host not in ("0.0.0.0", "::", ""):
        names.add(host_name(bind_host))
    return frozenset(names)


class HostGuard:
    """Refuse a request whose Host is not one of `names` (400) and a POST whose Origin names
    another host (403). A POST without an Origin (not a browser) is left to the CSRF check."""

    def __init__(self, app: ASGIApp, names: frozenset[str] | None) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.names is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = host_name(headers.get(b"host", b"").decode("latin-1"))
        if host not in self.names:
            await _refuse(
                send,
                400,
                f"Host {host!r} is not a name this dashboard is served as: start it with "
                f"--allowed-host {host or 'NAME'} if it is one\n",
            )
            return
        origin = headers.get(b"origin")
        # `Origin: null` is what a browser sends for the dashboard's own forms under its
        # no-referrer policy (and for sandboxed pages): the Host check above and the CSRF token
        # decide those. A named origin must be the dashboard's own.
        if scope.get("method") == "POST" and origin is not None and origin != b"null":
            parsed = urllib.parse.urlsplit(origin.decode("latin-1"))
            if parsed.scheme not in ("http", "https") or host_name(parsed.netloc) not in self.names:
                await _refuse(send, 403, "forbidden: a POST from another site's page\n")
                return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@attrs.frozen
class Auth:
    """The configured authentication (mode None: none, loopback only)."""

    mode: str | None = None
    user: str = "admin"
    secret: str = attrs.field(default="", repr=False)

    @classmethod
    def from_environment(cls, mode: str | None, host: str) -> Auth:
        """Validate `--auth` against the bind address; read the secret from the environment."""
        if mode is None:
            if not is_loopback(host):
                raise ConfigurationError(
                    f"--auth: required when binding {host!r} (not loopback): "
                    f"--auth basic (${PASSWORD_ENV}) or --auth token (${TOKEN_ENV})"
                )
            return cls()
        if mode not in AUTH_MODES:
            raise ConfigurationError(f"--auth: {mode!r} is not one of {', '.join(AUTH_MODES)}")
        env = PASSWORD_ENV if mode == "basic" else TOKEN_ENV
        secret = os.environ.get(env, "")
        if len(secret) < 12:
            raise ConfigurationError(
                f"--auth {mode}: set ${env} to a secret of at least 12 characters"
            )
        return cls(mode, os.environ.get(USER_ENV) or "admin", secret)

    def identify(self, headers: dict[bytes, bytes], cookies: dict[str, str]) -> str | None:
        """The caller's name if the request is authenticated, else None."""
        if self.mode is None:
            return "local"
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if self.mode == "basic":
            return self._basic(authorization)
        if authorization.lower().startswith("bearer "):
            return "token" if _same(authorization[7:].strip(), self.secret) else None
        return "token" if _same(cookies.get(TOKEN_COOKIE, ""), self.cookie_value()) else None

    def cookie_value(self) -> str:
        """What the token cookie holds: HMAC-SHA256 of a fixed purpose under the token. It
        opens the dashboard as the token does (so it stays valid across restarts and
        replicas), but a cookie read from a browser profile or a proxy's log does not give
        away the token itself (which may open other things: an API, another dashboard)."""
        key = self.secret.encode("utf-8", "surrogatepass")
        return hmac.new(key, _COOKIE_PURPOSE, hashlib.sha256).hexdigest()

    def offers_credentials(self, headers: dict[bytes, bytes], cookies: dict[str, str]) -> bool:
        """Whether a request tried to authenticate (a refusal of it is a failed login): a
        browser's first request, before the basic-auth challenge, offers nothing."""
        if b"authorization" in headers:
            return True
        return self.mode == "token" and TOKEN_COOKIE in cookies

    def _basic(self, authorization: str) -> str | None:
        if not authorization.lower().startswith("basic "):
            return None
        try:
            decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, _, password = decoded.partition(":")
        # Both compared every time (`&`, not `and`): the time taken does not tell a right user
        # name from a wrong one.
        return user if _same(user, self.user) & _same(password, self.secret) else None


def _same(offered: str, expected: str) -> bool:
    # Bytes: compare_digest refuses a non-ASCII str (TypeError), which a client chooses.
    return hmac.compare_digest(
        offered.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


@attrs.define(eq=False)
class LoginThrottle:
    """Failed logins per client address, in a sliding window: after `allowed` failures within
    `window` seconds the address must wait until the oldest of them leaves the window."""

    allowed: int = LOGIN_FAILURES_ALLOWED
    window: float = LOGIN_FAILURE_WINDOW
    remembered: int = LOGIN_ADDRESSES_REMEMBERED
    clock: Callable[[], float] = time.monotonic
    # Per address, its last `allowed` failure times (oldest first); the dict in order of each
    # address's last failure, so the first entries are the ones to forget.
    _failures: dict[str, collections.deque[float]] = attrs.field(init=False, factory=dict)

    def retry_after(self, address: str) -> float | None:
        """Seconds until `address` may try again, or None when it may now."""
        failures = self._failures.get(address)
        if failures is None or len(failures) < self.allowed:
            return None
        wait = failures[0] + self.window - self.clock()
        return wait if wait > 0 else None

    def failed(self, address: str) -> int:
        """Count one failed login of `address`; returns its failures within the window."""
        now = self.clock()
        failures = self._failures.pop(address, None)
        if failures is None:
            failures = collections.deque(maxlen=self.allowed)
        failures.append(now)
        self._failures[address] = failures  # last in the order: the most recent to fail
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        while len(self._failures) > self.remembered:
            del self._failures[next(iter(self._failures))]
        return len(failures)


def served_over_https(scope: Scope) -> bool:
    """Whether the browser reached the dashboard over https: directly, or through a proxy
    that says so (`X-Forwarded-Proto`; a client that lies only marks its own cookie Secure)."""
    if scope.get("scheme") == "https":
        return True
    headers: dict[bytes, bytes] = dict(scope.get("headers") or [])
    return headers.get(b"x-forwarded-proto", b"").split(b",")[0].strip().lower() == b"https"


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def parse_cookies(headers: dict[bytes, bytes]) -> dict[str, str]:
    cookies: dict[str, str] = {}
    for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
        name, _, value = part.strip().partition("=")
        if name:
            cookies[name] = value
    return cookies


@attrs.define(eq=False)
class Csrf:
    """Signed double-submit tokens; the key lives only in this process."""

    key: bytes = attrs.field(factory=lambda: secrets.token_bytes(32), repr=False)

    def new_nonce(self) -> str:
        return secrets.token_urlsafe(24)

    def token(self, nonce: str) -> str:
        return hmac.new(
            self.key, nonce.encode("utf-8", "surrogatepass"), hashlib.sha256
        ).hexdigest()

    def valid(self, nonce: str | None, token: str | None) -> bool:
        if not nonce or not token:
            return False
        return _same(self.token(nonce), token)  # a non-ASCII field is wrong, not an error


class AuthMiddleware:
    """Refuse unauthenticated requests (401 with a challenge) and add the security headers;
    log and throttle failed logins per client address (429 with Retry-After).

    A token given once as `?token=` is moved into an HttpOnly cookie (holding a value derived
    from the token), so a browser can open a token-protected dashboard from a link."""

    def __init__(self, app: ASGIApp, auth: Auth, throttle: LoginThrottle | None = None) -> None:
        self.app = app
        self.auth = auth
        self.throttle = LoginThrottle() if throttle is None else throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        address = client_address(scope)
        if self.auth.mode is not None:
            # Checked before the credentials: a guesser that is held back learns nothing.
            wait = self.throttle.retry_after(address)
            if wait is not None:
                await _too_many_failures(send, wait)
                return
        headers = dict(scope["headers"])
        cookies = parse_cookies(headers)
        query_token = _query_token(scope)
        if self.auth.mode == "token" and query_token is not None:
            if _same(query_token, self.auth.secret):
                await _redirect_with_cookie(
                    send, scope["path"], self.auth.cookie_value(), served_over_https(scope)
                )
                return
            if self.auth.identify(headers, cookies) is None:
                await self._failed(send, address, "a wrong ?token=")
                return
        user = self.auth.identify(headers, cookies)
        if user is None:
            if self.auth.offers_credentials(headers, cookies):
                await self._failed(send, address, _offered(self.auth.mode, headers))
            else:
                await _unauthorized(send, self.auth.mode or "")
            return
        scope.setdefault("state", {})["user"] = user

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _failed(self, send: Send, address: str, what: str) -> None:
        failures = self.throttle.failed(address)
        held = failures >= self.throttle.allowed
        log.warning(
            "dashboard: failed login from %s (%s; %d in the last %ds%s)",
            address,
            what,
            failures,
            self.throttle.window,
            ": its requests get 429 until the oldest is that old" if held else "",
        )
        await _unauthorized(send, self.auth.mode or "", clear_cookie=self.auth.mode == "token")


def _offered(mode: str | None, headers: dict[bytes, bytes]) -> str:
    """What a refused request offered, for the log line: its kind, never its content."""
    authorization = headers.get(b"authorization", b"").split(b" ", 1)[0].lower()
    if authorization == b"basic":
        return "wrong basic credentials"
    if authorization == b"bearer":
        return "a wrong bearer token"
    if authorization:
        return f"an Authorization header that is not {mode}"
    return "a wrong token cookie"


def _query_token(scope: Scope) -> str | None:
    query: bytes = scope.get("query_string", b"")
    for part in query.decode("latin-1").split("&"):
        name, _, value = part.partition("=")
        if name == "token":
            return urllib.parse.unquote_plus(value)
    return None


async def _redirect_with_cookie(send: Send, path: str, value: str, secure: bool) -> None:
    cookie = f"{TOKEN_COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/"
    if secure:
        cookie += "; Secure"
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [
                (b"location", path.encode() if path.startswith("/") else b"/"),
                (b"set-cookie", cookie.encode("latin-1")),
                *SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def _refuse(send: Send, status: int, text: str) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), *SECURITY_HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text.encode()})


async def _unauthorized(send: Send, mode: str, *, clear_cookie: bool = False) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), *SECURITY_HEADERS]
    if mode == "basic":
        headers.append((b"www-authenticate", b'Basic realm="trioq dashboard", charset="UTF-8"'))
    if clear_cookie:  # a stale cookie (the token changed) would fail every request again
        expired = f"{TOKEN_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"
        headers.append((b"set-cookie", expired.encode()))
    body = b"authentication required\n"
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _too_many_failures(send: Send, wait: float) -> None:
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"retry-after", str(math.ceil(wait)).encode()),
        *SECURITY_HEADERS,
    ]
    body = b"too many failed logins from this address: try again later\n"
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "Auth",
    "AuthMiddleware",
    "Csrf",
    "HostGuard",
    "LoginThrottle",
    "is_loopback",
    "served_names",
]
