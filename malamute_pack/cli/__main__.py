"""
C{python -m malamute_pack.cli}: the C{malamute} command.

Tests: ``tests/system/test_cli.py``.
"""

import sys

from malamute_pack.cli.main import main

sys.exit(main())
