"""trioq's benchmark suite: `python -m bench` (see bench/RESULTS.md for the latest figures).

Every scenario runs against real `trioq worker` processes and an embedded PostgreSQL started for
the run (with pg_stat_statements loaded), next to a raw asyncio + asyncpg baseline loop on the
same database, so every figure can be read as a ratio to "the fastest a Python worker goes here".
"""
