"""A WSGI app with a module-level SyncProducer, as docs/producers.md shows it, served by
`gunicorn --preload` in tests/test_producer_connections.py: the producer is made (and used) in
gunicorn's master, then forked into the workers, each of which enqueues a job per request."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from trioq.producer import SyncProducer

producer = SyncProducer(
    os.environ["TRIOQ_DATABASE_URL"], schema=os.environ["TRIOQ_TEST_SCHEMA"], pool_size=2
)
# Used before the fork: the master's pool holds an idle connection the workers inherit.
producer.enqueue("noop", {"pid": os.getpid(), "from": "master"})


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    job = producer.enqueue("noop", {"pid": os.getpid()})
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({"job": job.id, "pid": os.getpid()}).encode()]
