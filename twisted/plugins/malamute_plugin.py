"""
The ``twistd malamute`` plugin. Tests: ``tests/system/test_tap.py``.
"""

from twisted.application.service import ServiceMaker

malamute = ServiceMaker(
    "malamute_pack", "malamute_pack.tap", "A Malamute message broker", "malamute"
)
