"""docs/state-machine.md's diagram is rendered from `TRANSITIONS`, `INSERTED` and `DELETED_BY`.

The test fails when the diagram in the doc differs from the rendering; run it with
`TRIOQ_REGENERATE_DOCS=1` to write the rendering into the doc instead.
"""

from __future__ import annotations

import os
import pathlib
import re

from trioq._core.states import DELETED_BY, INSERTED, TRANSITIONS, JobState

DOC = pathlib.Path(__file__).parent.parent / "docs" / "state-machine.md"
BLOCK = re.compile(r"```mermaid\n(.*?)```\n", re.DOTALL)
ORDER = list(JobState)


def _label(statements: tuple[str, ...]) -> str:
    return ", ".join(sorted(statements))


def render_diagram() -> str:
    """The mermaid block: insertions, then the edges by source and target state (in JobState's
    order), then deletions; each edge labelled with the statements allowed to make it."""
    lines = ["stateDiagram-v2"]
    for state in sorted(INSERTED, key=ORDER.index):
        lines.append(f"    [*] --> {state}: {_label(INSERTED[state])}")
    for source, target in sorted(TRANSITIONS, key=lambda e: (ORDER.index(e[0]), ORDER.index(e[1]))):
        lines.append(f"    {source} --> {target}: {_label(TRANSITIONS[(source, target)])}")
    for state in sorted(DELETED_BY, key=ORDER.index):
        lines.append(f"    {state} --> [*]: {_label(DELETED_BY[state])}")
    return "\n".join(lines) + "\n"


def test_the_state_diagram_in_the_doc_is_rendered_from_transitions() -> None:
    doc = DOC.read_text()
    match = BLOCK.search(doc)
    assert match is not None, f"{DOC} has no ```mermaid block"
    rendered = render_diagram()
    if os.environ.get("TRIOQ_REGENERATE_DOCS") == "1":
        DOC.write_text(doc[: match.start(1)] + rendered + doc[match.end(1) :])
        return
    assert match[1] == rendered, (
        "docs/state-machine.md's diagram differs from trioq/_core/states.py: rewrite it with "
        "`TRIOQ_REGENERATE_DOCS=1 python -m pytest tests/test_state_diagram.py`"
    )


def test_every_state_appears_in_the_diagram() -> None:
    rendered = render_diagram()
    for state in JobState:
        assert re.search(rf"\b{state}\b", rendered), state
