"""Admission control's reaction time to an injected overload, with the default policy.

`python -m bench.admission_reaction`: an idle worker (25 slots, in-memory driver, real clock);
then the trio thread is blocked 0.3 s out of every ~0.3 s (as CPU-bound handler code does).
Reports the time from the first block to the first cut of the effective limit, and from the
end of the overload to full recovery, over a few repetitions.
"""

from __future__ import annotations

import json
import statistics
import time

import trio

import trioq
from trioq._memory import MemoryDriver


async def once() -> tuple[float, float, list[int]]:
    app = trioq.App(schema="reaction")

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    cut, recovered = trio.Event(), trio.Event()
    limits: list[int] = []

    def on_change(queue: str, state: object) -> None:
        limits.append(state.limit)  # type: ignore[attr-defined]
        if state.limit < 25:  # type: ignore[attr-defined]
            cut.set()
        if state.limit == 25 and cut.is_set():  # type: ignore[attr-defined]
            recovered.set()

    lagging = True

    async def inject() -> None:
        while lagging:
            time.sleep(0.3)  # noqa: ASYNC251 -- the injected overload
            await trio.lowlevel.checkpoint()

    async with app.client(driver=MemoryDriver()), trio.open_nursery() as nursery:
        worker = app.worker(["default"], 25, grace_seconds=0)
        worker.admission.on_change = on_change
        await nursery.start(worker.run)
        await trio.sleep(1.0)
        started = trio.current_time()
        nursery.start_soon(inject)
        await cut.wait()
        reaction = trio.current_time() - started
        await trio.sleep(6.0)  # sustained: further cuts
        lagging = False
        ended = trio.current_time()
        await recovered.wait()
        recovery = trio.current_time() - ended
        worker.request_drain()
    return reaction, recovery, limits


def main() -> None:
    runs = [trio.run(once) for _ in range(3)]
    reactions = [r for r, _, _ in runs]
    print(
        json.dumps(
            {
                "reaction_seconds": [round(r, 3) for r in reactions],
                "reaction_median": round(statistics.median(reactions), 3),
                "recovery_seconds": [round(r, 2) for _, r, _ in runs],
                "limits_first_run": runs[0][2],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
