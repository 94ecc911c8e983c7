"""
The pack: brokers on different hosts that find one another with Zyre (ZRE
beacons on a LAN, zgossip in a cloud) and forward streams, mailboxes and
services over peer links.

Tests: ``tests/unit/test_pack_node.py``.
"""
