"""The worker's services around the claim loops: the supervisor, lease renewal and the
watchdog, leadership and the leader's passes, admission control, health, metrics and logs."""
