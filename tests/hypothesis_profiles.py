"""Hypothesis profiles, chosen by `HYPOTHESIS_PROFILE`, else `ci` when `CI` is set, else `dev`.

- `dev` (the inner loop): few examples, so `pytest -m "not slow"` stays quick.
- `ci` (what .ci/run gets, with CI=true): Hypothesis's own CI settings (derandomized, no example
  database, the reproduction blob printed), so a CI failure replays from its
  `@reproduce_failure` line; the differential machines run 200 examples.
- `nightly`: random and ten times longer, to look for what the fixed CI examples miss.
"""

from __future__ import annotations

import os

import hypothesis

hypothesis.settings.register_profile("dev", max_examples=20, deadline=None)
hypothesis.settings.register_profile("ci", parent=hypothesis.settings.get_profile("ci"))
hypothesis.settings.register_profile(
    "nightly", max_examples=1000, deadline=None, print_blob=True, derandomize=False
)

PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")

# Examples of the stateful machines that drive both drivers (each example is tens of
# statements against PostgreSQL: 0.15-0.2 s on a loaded 2-core machine once the examples share
# one migrated schema, so 200 examples cost 30-45 s a machine).
MACHINE_EXAMPLES = {"dev": 10, "ci": 200, "nightly": 2000}.get(PROFILE, 200)


def load() -> None:
    hypothesis.settings.load_profile(PROFILE)
