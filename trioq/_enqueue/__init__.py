"""The enqueue layer's private half: task declarations, enqueue options and the one validation
path from (task, payloads, options) to the rows the insert statements write (`rows.py`)."""
