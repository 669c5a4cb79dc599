"""`trioq dashboard`: a web view of queues, jobs, workflows and schedules (docs/dashboard.md).

Starlette on hypercorn's trio worker; pages rendered on the server with Jinja2 (autoescaped);
htmx, vendored in static/, refreshes the live parts. Read-only unless started with `--admin`.
The application is in `trioq.dashboard.app` (`serve_dashboard`, `DashboardConfig`); this
package imports nothing at import time, so `trioq --help` does not load the web stack.
"""
