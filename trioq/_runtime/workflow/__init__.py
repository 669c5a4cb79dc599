"""The durable primitives behind `ctx`: checkpoints, waits, messages, spawns, parallel blocks."""
