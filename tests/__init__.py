"""
The test suites: ``tests/unit`` (in this process) and ``tests/system``
(real processes, namespaces, Spark, the browser), and the support modules
both use.

Hypothesis runs here with no deadline and without its too-slow health
check: the suites run in parallel on a shared machine (``scripts/test``),
where how long a draw or an example takes says nothing about the code
under test. What the properties assert is unchanged.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "malamute",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("malamute")
