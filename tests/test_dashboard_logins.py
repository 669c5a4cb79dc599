"""Failed dashboard logins: logged in one line without the secret, throttled per client address
(429 with Retry-After); the token cookie holds a value derived from the token, Secure over https."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest

from trioq.dashboard.security import (
    LOGIN_FAILURES_ALLOWED,
    Auth,
    AuthMiddleware,
    LoginThrottle,
    served_over_https,
)

SECRET = "correct horse battery staple"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def basic(user: str, password: str) -> list[tuple[bytes, bytes]]:
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    return [(b"authorization", f"Basic {encoded}".encode())]


async def call(
    middleware: AuthMiddleware,
    headers: list[tuple[bytes, bytes]],
    *,
    address: str = "10.0.0.1",
    query: bytes = b"",
    scheme: str = "http",
) -> dict[str, Any]:
    """One request through the middleware: its status and headers (a header named twice keeps
    its last value)."""
    seen: dict[str, Any] = {}

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            seen["status"] = message["status"]
            seen["headers"] = dict(message["headers"])

    middleware.app = inner
    scope = {
        "type": "http",
        "scheme": scheme,
        "path": "/jobs",
        "headers": headers,
        "query_string": query,
        "client": (address, 40000),
    }
    await middleware(scope, receive, send)
    return seen


async def test_failed_logins_are_logged_without_the_secret_and_an_address_is_held_after_ten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    middleware = AuthMiddleware(
        None,  # type: ignore[arg-type]
        Auth("basic", "ops", SECRET),
        LoginThrottle(clock=clock),
    )
    caplog.set_level(logging.WARNING, logger="trioq.dashboard")
    guesses = [f"guess-{n}-{SECRET}" for n in range(LOGIN_FAILURES_ALLOWED)]
    for guess in guesses:
        assert (await call(middleware, basic("ops", guess)))["status"] == 401
        clock.now += 1
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == LOGIN_FAILURES_ALLOWED  # one line per failure
    assert all("failed login from 10.0.0.1 (wrong basic credentials" in line for line in lines)
    assert not [line for line in lines if "guess" in line or SECRET in line or "ops" in line]
    assert "429" in lines[-1]
    # Held: even the right credentials get 429, unchecked, until the oldest failure is 60 s old.
    held = await call(middleware, basic("ops", SECRET))
    assert held["status"] == 429
    assert held["headers"][b"retry-after"] == b"50"  # the first failure was 10 s ago
    assert (await call(middleware, basic("ops", SECRET), address="10.0.0.2"))["status"] == 200
    clock.now += 50
    assert (await call(middleware, basic("ops", SECRET)))["status"] == 200
    assert len(caplog.records) == LOGIN_FAILURES_ALLOWED  # a refusal with 429 logs nothing


async def test_a_request_offering_no_credentials_is_not_a_failed_login(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A browser's first request (before the basic-auth challenge) offers nothing: refused with
    401 as often as it comes, never counted, never logged."""
    middleware = AuthMiddleware(None, Auth("basic", "ops", SECRET))  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, logger="trioq.dashboard")
    for _ in range(3 * LOGIN_FAILURES_ALLOWED):
        assert (await call(middleware, []))["status"] == 401
    assert caplog.records == []
    assert (await call(middleware, basic("ops", SECRET)))["status"] == 200


async def test_wrong_tokens_in_every_place_count_as_failed_logins() -> None:
    middleware = AuthMiddleware(None, Auth("token", secret=SECRET))  # type: ignore[arg-type]
    wrong = [
        ([(b"authorization", b"Bearer nope")], b""),
        ([(b"cookie", b"trioq_token=nope")], b""),
        ([], b"token=nope"),
    ]
    for _ in range(4):
        for headers, query in wrong:
            await call(middleware, headers, query=query)
    assert (await call(middleware, [(b"authorization", f"Bearer {SECRET}".encode())]))[
        "status"
    ] == 429


def test_the_throttle_remembers_a_bounded_number_of_addresses() -> None:
    throttle = LoginThrottle(allowed=2, remembered=100, clock=FakeClock())
    for n in range(1000):
        throttle.failed(f"10.1.{n // 256}.{n % 256}")
    assert len(throttle._failures) == 100
    throttle.failed("10.9.9.9")
    throttle.failed("10.9.9.9")
    assert throttle.retry_after("10.9.9.9") == 60.0


async def test_the_token_cookie_holds_a_derived_value_and_is_secure_over_https() -> None:
    auth = Auth("token", secret=SECRET)
    middleware = AuthMiddleware(None, auth)  # type: ignore[arg-type]
    query = f"token={SECRET.replace(' ', '+')}".encode()
    plain = (await call(middleware, [], query=query))["headers"][b"set-cookie"].decode()
    value = plain.split(";")[0].partition("=")[2]
    assert value == auth.cookie_value() and SECRET not in plain and "horse" not in plain
    assert "HttpOnly" in plain and "SameSite=Strict" in plain and "Secure" not in plain
    cookie = [(b"cookie", f"trioq_token={value}".encode())]
    assert (await call(middleware, cookie))["status"] == 200
    # The token itself in the cookie is not the cookie's value: refused (and the cookie cleared).
    raw = await call(middleware, [(b"cookie", f"trioq_token={SECRET}".encode())])
    assert raw["status"] == 401 and b"Max-Age=0" in raw["headers"][b"set-cookie"]
    secure = await call(middleware, [], query=query, scheme="https")
    assert "; Secure" in secure["headers"][b"set-cookie"].decode()
    proxied = await call(middleware, [(b"x-forwarded-proto", b"https")], query=query)
    assert "; Secure" in proxied["headers"][b"set-cookie"].decode()


def test_https_is_the_scheme_or_what_the_proxy_says() -> None:
    assert served_over_https({"scheme": "https", "headers": []})
    assert served_over_https({"scheme": "http", "headers": [(b"x-forwarded-proto", b"HTTPS")]})
    assert not served_over_https({"scheme": "http", "headers": []})
