"""systemd-analyze for the unit-file tests (installed by ``tests/harness/systemd/setup.sh``)."""
