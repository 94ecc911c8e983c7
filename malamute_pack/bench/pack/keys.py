"""
The keys of the pack benchmark's CURVE packs, made per run in the run's
directory (L{PackKeys.make}): a key pair per host, written by
L{malamute_pack.transport.curve.write_certificates} (C{NAME.key} public,
C{NAME.key_secret} mode 0600, which a broker requires), and the pack-keys
directory (C{--pack-keys}) with copies of every host's public
certificate.

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from malamute_pack.transport.curve import KeyPair, write_certificates

# Under the directory given to PackKeys.make: the hosts' certificates, and
# the copies of their public ones that a broker's --pack-keys names.
CERTIFICATES, PACK_KEYS = "certificates", "pack-keys"


@dataclass(frozen=True)
class PackKeys:
    """
    The keys of a CURVE pack whose brokers run on the hosts named.

    @ivar directory: the pack-keys directory: every host's public certificate.
    @ivar secrets: per host, its secret certificate (its C{--pack-secret}).
    @ivar public: per host, its public key (Z85, 40 characters: what a
        gossip client gives after C{ENDPOINT|}).
    """

    directory: Path
    secrets: dict[str, Path]
    public: dict[str, str]

    @classmethod
    def make(cls, directory: Path, names: Sequence[str]) -> PackKeys:
        """A key pair for each host of C{names}, under C{directory} (made if missing)."""
        certificates = directory / CERTIFICATES
        listed = directory / PACK_KEYS
        listed.mkdir(parents=True, exist_ok=True)
        secrets, public = {}, {}
        for name in names:
            public_file, secret_file = write_certificates(certificates, name)
            shutil.copy(public_file, listed)
            secrets[name] = secret_file
            public[name] = KeyPair.load(secret_file).public.decode("ascii")
        return cls(listed, secrets, public)
