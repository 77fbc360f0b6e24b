"""``gputally demo``: the recorded H200 replayed through a real ``serve`` with ``usage``, no
cluster needed; the chargeback table, the idle event as it fires, and where the same data shows
up in Prometheus and the dashboards. See README.md beside this module."""

__all__: list[str] = []
