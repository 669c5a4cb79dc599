"""Credentials and CSRF fields a client chooses: non-ASCII is wrong, never a server error."""

from __future__ import annotations

import base64

from trioq.dashboard.security import Auth, Csrf


def basic(user: str, password: str) -> dict[bytes, bytes]:
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {b"authorization": f"Basic {encoded}".encode()}


def test_a_non_ascii_csrf_field_is_a_wrong_token_not_an_error() -> None:
    csrf = Csrf()
    nonce = csrf.new_nonce()
    assert not csrf.valid(nonce, "é" * 64)
    assert not csrf.valid("é", csrf.token(nonce))
    assert csrf.valid(nonce, csrf.token(nonce))


def test_non_ascii_credentials_are_refused_not_an_error() -> None:
    auth = Auth("basic", "admin", "s3cret-passw0rd")
    assert auth.identify(basic("admin", "s3cret-passw0rd"), {}) == "admin"
    assert auth.identify(basic("ädmin", "s3cret-passw0rd"), {}) is None
    assert auth.identify(basic("admin", "pässword"), {}) is None
    token = Auth("token", "admin", "s3cret-passw0rd")
    assert token.identify({}, {"trioq_token": "tök"}) is None
