"""The bridge from trio to blocking libpq calls: one worker thread per call, never abandoned.

`abandon_on_cancel` is never used for a call on an open connection: an abandoned thread would
keep using the connection while trio hands it to somebody else, and its statement would keep
running (and holding locks) on the server. Instead, a cancelled call asks the server to cancel the
statement and then waits, shielded, for the thread to come back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import outcome
import trio

logger = logging.getLogger("trioq.pg")

T = TypeVar("T")

# A cancel request can arrive before the statement reaches the server (the worker thread may not
# have sent it yet); the server then ignores it. So it is repeated, backing off, until the thread
# returns. A request that arrives once the backend is idle again is discarded by the server.
_CANCEL_RESEND_FIRST = 0.05
_CANCEL_RESEND_MAX = 1.0


async def run_blocking(
    fn: Callable[[], T], *, cancel_on_server: Callable[[], None], name: str = "trioq pg call"
) -> T:
    """Run `fn` in a worker thread and return its result (or raise its exception).

    If the calling task is cancelled or interrupted (KeyboardInterrupt) while `fn` runs,
    `cancel_on_server` is called in another worker thread, repeatedly with backoff, until `fn`
    returns; only then is the cancellation re-raised. Cancellation therefore leaves no thread
    behind and no statement running, but it is not instant: it takes one server round trip, or as
    long as the call needs to notice that the network is dead (bounded by TCP keepalives and
    `tcp_user_timeout`). A second KeyboardInterrupt during that wait abandons the thread.
    """
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list[outcome.Outcome[T]] = []

    def store(result: outcome.Outcome[T]) -> None:
        box.append(result)
        done.set()

    def deliver(result: outcome.Outcome[T]) -> None:  # runs in the worker thread
        with contextlib.suppress(trio.RunFinishedError):  # only after an abandoning second ^C
            token.run_sync_soon(store, result)

    trio.lowlevel.start_thread_soon(fn, deliver, name=name)
    try:
        await done.wait()
    except BaseException:  # trio.Cancelled, KeyboardInterrupt
        with trio.CancelScope(shield=True):
            await cancel_until_done(done, cancel_on_server)
        raise
    return box[0].unwrap()


async def cancel_until_done(done: trio.Event, cancel_on_server: Callable[[], None]) -> None:
    """Ask the server to cancel (in a worker thread, backing off) until `done` is set."""
    delay = _CANCEL_RESEND_FIRST
    while not done.is_set():
        try:
            await trio.to_thread.run_sync(cancel_on_server)
        except Exception as exc:  # the connection may be broken; waiting is all that is left
            logger.debug("server-side cancel request failed: %r", exc)
        with trio.move_on_after(delay):
            await done.wait()
        delay = min(delay * 2, _CANCEL_RESEND_MAX)


async def open_in_thread(
    open_fn: Callable[[], T], close_fn: Callable[[T], None], *, name: str = "trioq pg connect"
) -> T:
    """Run `open_fn` (which opens a resource) in a worker thread and return the resource.

    Unlike `run_blocking`, cancellation returns at once: the thread is left to finish on its own
    (nothing else can be using a connection that is still being opened), and if it does produce a
    resource, that thread closes it with `close_fn`. So a cancelled connect leaves, at most, a
    worker thread finishing its connection attempt (bounded by `connect_timeout`) and no open
    connection.
    """
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list[outcome.Outcome[T]] = []
    guard = threading.Lock()
    state = {"delivered": False, "abandoned": False}

    def store(result: outcome.Outcome[T]) -> None:
        box.append(result)
        done.set()

    def deliver(result: outcome.Outcome[T]) -> None:  # runs in the worker thread
        with guard:
            if not state["abandoned"]:
                state["delivered"] = True
                token.run_sync_soon(store, result)
                return
        if isinstance(result, outcome.Value):
            close_fn(result.value)

    trio.lowlevel.start_thread_soon(open_fn, deliver, name=name)
    try:
        await done.wait()
    except BaseException:
        with guard:
            state["abandoned"] = not state["delivered"]
        if not state["abandoned"]:
            # The result is already on its way to us: take it and close it ourselves.
            with trio.CancelScope(shield=True):
                await done.wait()
                result = box[0]
                if isinstance(result, outcome.Value):
                    await trio.to_thread.run_sync(close_fn, result.value)
        raise
    return box[0].unwrap()
