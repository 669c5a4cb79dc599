"""The outside world of the reference app, simulated in process: a chat API, a partner API that
serves data in pages, and a mailer. Deterministic (no randomness, no network): each call takes a
fixed time and its answer depends only on its arguments; failures are injected through `FAULTS`
("fail this call N times", "always fail this call"). What each provider did is kept in memory so
tests and the demo can check the side effects.
"""

from __future__ import annotations

import collections
import hashlib

import attrs
import trio

CALL_SECONDS = 0.005  # one simulated round trip


class ProviderUnavailable(Exception):
    """The simulated provider answered 503 (an injected failure)."""


@attrs.define(eq=False)
class Faults:
    """Injected failures by call key (e.g. 'partner:13:page1'): a key in `always` fails every
    time; a key in `times` fails that many times, then succeeds."""

    times: dict[str, int] = attrs.field(factory=dict)
    always: set[str] = attrs.field(factory=set)
    calls: collections.Counter[str] = attrs.field(factory=collections.Counter)

    def check(self, key: str) -> None:
        seen = self.calls[key]
        self.calls[key] += 1
        if key in self.always or seen < self.times.get(key, 0):
            raise ProviderUnavailable(f"{key}: 503 Service Unavailable (injected)")


@attrs.define(eq=False)
class ChatAPI:
    """Posts replies; an idempotency key makes a repeated post return the first message."""

    sent: list[tuple[str, str]] = attrs.field(factory=list)  # (conversation, text) in order
    _by_key: dict[str, str] = attrs.field(factory=dict)

    async def post_message(self, conversation_id: str, text: str, idempotency_key: str) -> str:
        await trio.sleep(CALL_SECONDS)
        FAULTS.check(f"chat:{conversation_id}")
        if idempotency_key not in self._by_key:
            digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]
            self._by_key[idempotency_key] = f"msg-{digest}"
            self.sent.append((conversation_id, text))
        return self._by_key[idempotency_key]


@attrs.define(eq=False)
class PartnerAPI:
    """Serves a source's records in pages of `page_size`; the last page is short."""

    page_size: int = 25
    pages_served: list[tuple[int, int]] = attrs.field(factory=list)

    async def fetch_page(self, source_id: int, page: int, pages: int) -> list[str]:
        await trio.sleep(CALL_SECONDS)
        FAULTS.check(f"partner:{source_id}:page{page}")
        self.pages_served.append((source_id, page))
        size = self.page_size if page < pages - 1 else self.page_size // 2
        return [f"{source_id}-{page}-{n}" for n in range(size)]


@attrs.define(eq=False)
class Mailer:
    outbox: list[tuple[str, str]] = attrs.field(factory=list)  # (to, subject)

    async def send(self, to: str, subject: str) -> None:
        await trio.sleep(CALL_SECONDS)
        FAULTS.check(f"mail:{to}")
        self.outbox.append((to, subject))


FAULTS = Faults()
CHAT = ChatAPI()
PARTNER = PartnerAPI()
MAILER = Mailer()


def reset() -> None:
    """Forget every side effect and injected failure (tests call it between runs)."""
    global FAULTS, CHAT, PARTNER, MAILER
    FAULTS, CHAT, PARTNER, MAILER = Faults(), ChatAPI(), PartnerAPI(), Mailer()
