"""The thread-free LISTEN connection against a real server: delivery, quoting, and reconnects."""

from __future__ import annotations

import attrs
import pytest
import trio

from tests.support import wait_until
from trioq._pg import Connection, open_listener


@attrs.define(eq=False)
class Recorder:
    """Callbacks for open_listener that record calls and let a test wait for them."""

    notifications: list[tuple[str, str]] = attrs.field(factory=list)
    reconnects: int = 0
    _arrived: trio.Event = attrs.field(factory=trio.Event)
    _reconnected: trio.Event = attrs.field(factory=trio.Event)

    def on_notify(self, channel: str, payload: str) -> None:
        self.notifications.append((channel, payload))
        self._arrived.set()

    def on_reconnect(self) -> None:
        self.reconnects += 1
        self._reconnected.set()

    async def wait_for(self, channel: str, payload: str) -> None:
        with trio.fail_after(5):
            while (channel, payload) not in self.notifications:
                self._arrived = trio.Event()
                await self._arrived.wait()

    async def wait_reconnected(self) -> None:
        with trio.fail_after(10):
            await self._reconnected.wait()
        self._reconnected = trio.Event()


async def notify(observer: Connection, channel: str, payload: str) -> None:
    await observer.execute("SELECT pg_notify(%s, %s)", [channel, payload])


async def test_notification_reaches_the_callback_even_for_a_channel_needing_quotes(
    pg_url: str, observer: Connection
) -> None:
    recorder = Recorder()
    channel = 'Mixed Case "quoted"; channel'
    async with open_listener(pg_url, on_notify=recorder.on_notify) as listener:
        assert listener.connected
        await listener.listen(channel)
        await notify(observer, channel, "hello")
        await recorder.wait_for(channel, "hello")
    assert recorder.notifications == [(channel, "hello")]


async def test_listen_twice_delivers_once_and_unlisten_stops_delivery(
    pg_url: str, observer: Connection
) -> None:
    recorder = Recorder()
    async with open_listener(pg_url, on_notify=recorder.on_notify) as listener:
        await listener.listen("twice")
        await listener.listen("twice")
        await listener.listen("sentinel")
        await notify(observer, "twice", "1")
        await notify(observer, "sentinel", "a")
        await recorder.wait_for("sentinel", "a")
        await listener.unlisten("twice")
        await notify(observer, "twice", "2")
        await notify(observer, "sentinel", "b")
        await recorder.wait_for("sentinel", "b")
    assert recorder.notifications == [
        ("twice", "1"),
        ("sentinel", "a"),
        ("sentinel", "b"),
    ]


async def test_listener_reconnects_relistens_and_calls_on_reconnect_after_termination(
    pg_url: str, observer: Connection
) -> None:
    recorder = Recorder()
    async with open_listener(
        pg_url, on_notify=recorder.on_notify, on_reconnect=recorder.on_reconnect
    ) as listener:
        await listener.listen("jobs")
        first_pid = listener.backend_pid
        assert await observer.fetchval("SELECT pg_terminate_backend(%s, 5000)", [first_pid])
        await recorder.wait_reconnected()
        assert listener.connected
        assert listener.backend_pid not in (None, first_pid)
        await notify(observer, "jobs", "after")
        await recorder.wait_for("jobs", "after")
        # a channel added after the loss is LISTENed on the new connection too
        await listener.listen("later")
        await notify(observer, "later", "x")
        await recorder.wait_for("later", "x")
    assert recorder.reconnects == 1


async def test_leaving_the_block_closes_the_listen_connection(
    pg_url: str, observer: Connection
) -> None:
    recorder = Recorder()
    async with open_listener(pg_url, on_notify=recorder.on_notify) as listener:
        await listener.listen("bye")
        pid = listener.backend_pid
    assert not listener.connected

    async def session_gone() -> bool:
        sessions = await observer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
        )
        return bool(sessions == 0)

    with trio.fail_after(30):  # the server ends the backend after it reads the closed socket
        await wait_until(session_gone)


async def test_a_callback_error_drops_that_notification_logs_once_and_the_listener_goes_on(
    pg_url: str, observer: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Any login may NOTIFY any channel: a payload a callback cannot take must not stop the
    listener (the worker's, a client's) or the process around it."""
    delivered: list[str] = []
    last = trio.Event()

    def picky(channel: str, payload: str) -> None:
        if payload.startswith("bad"):
            raise ValueError(f"bad callback for {channel}")
        delivered.append(payload)
        last.set()

    async with open_listener(pg_url, on_notify=picky) as listener:
        await listener.listen("boom")
        for payload in ("bad 1", "bad 2", "good"):
            await notify(observer, "boom", payload)
        with trio.fail_after(10):
            await last.wait()
    assert delivered == ["good"]
    dropped = [r for r in caplog.records if "a notification on boom was dropped" in r.message]
    assert len(dropped) == 1  # once per channel, not once per payload
