"""
The ``twistd malamute-bridge`` plugin. Tests: ``tests/unit/test_multicast_tap.py``.
"""

from twisted.application.service import ServiceMaker

malamute_bridge = ServiceMaker(
    "malamute_pack bridge",
    "malamute_pack.multicast.tap",
    "A multicast bridge: a broker's streams re-broadcast over PGM or NORM",
    "malamute-bridge",
)
