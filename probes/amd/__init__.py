"""The AMD probe: amdsmi snapshots (live, replayed or recorded) mapped onto the shared catalog."""
