"""
Operations: what the broker shows and lets an operator do while it runs:
its statistics (L{malamute_pack.ops.stats}), the management API and
dashboard over HTTP, Prometheus metrics and the C{$broker} management
service that the C{malamute} command line asks.

Its modules:

- C{service}: L{malamute_pack.ops.service.OperationsService}: sampling,
  the C{$broker} service, the counters' log line, the HTTP API.
- C{stats}: L{Statistics}: JSON-ready sections read from the model, the
  journal, the settings and the features.
- C{rates}: rates from counters sampled once a second.
- C{admin}: an operator's actions: purge, delete, disconnect, retention.
- C{http}: the management API, dashboard, C{/healthz} and C{/readyz} over
  C{twisted.web}.
- C{metrics}: Prometheus metrics for C{GET /metrics}.
- C{management}: the C{$broker} service, an internal session of the model.
- C{sdnotify}: systemd's readiness protocol (C{sd_notify}).
- C{config}: operations' settings (C{--http}, C{--stats-interval}).
- C{feature}: operations as a feature of the broker (its C{FEATURE}).
- C{dashboard/}: the dashboard's static page (HTML, CSS, JS; no Python).

Tests: ``tests/unit/test_ops_stats.py``.
"""
