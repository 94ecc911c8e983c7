"""
CURVE keys: the broker's long-term key pair and the clients it lets in,
read from certificate files in the format CZMQ's C{zcert} and pyzmq's
C{zmq.auth} write (ZPL: a C{curve} section with C{public-key} and, in a
secret certificate, C{secret-key}, 40 characters of Z85 each; an optional
C{metadata} section)::

    metadata
        user = "alice"
    curve
        public-key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"

The clients (C{--curve-clients}) are either a directory, where every
C{*.key} file is one client's public certificate, or one file: a
certificate, or C{user = public-key} lines (C{#} comments). A
certificate's user is its C{metadata/user}, else its C{metadata/name},
else its file name without C{.key}. A user may have several keys; a key
belongs to one user.

C{python -m malamute_pack.transport.curve DIRECTORY NAME [USER]} makes a
key pair: C{NAME.key} (the public certificate, to hand out) and
C{NAME.key_secret} (readable by its owner only).

Tests: ``tests/unit/test_transport_curve.py``.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from twisted.logger import Logger
from zmq.utils import z85

from malamute_pack.transport.zap import RESERVED_USERS, KeyAllowList
from malamute_pack.zpl import ZplError, parse_zpl

_log = Logger()


class CurveError(ValueError):
    """A key or certificate the broker cannot use; the message says which and why."""


def check_key(key: str, what: str) -> bytes:
    """C{key}, 40 characters of Z85 for 32 bytes, as ASCII bytes; L{CurveError} if it is not."""
    try:
        raw = key.encode("ascii")
        if len(raw) != 40 or len(z85.decode(raw)) != 32:
            raise ValueError(f"{len(key)} characters, not 40")
    except (ValueError, UnicodeError, KeyError, IndexError) as e:
        raise CurveError(f"{what}: not a CURVE key in Z85 ({e})") from None
    return raw


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as e:
        raise CurveError(f"cannot read {path}: {e}") from e


def _certificate(path: Path, text: str) -> dict[str, list[str]]:
    try:
        found = parse_zpl(text)
    except ZplError as e:
        raise CurveError(f"{path}: not a certificate: {e}") from e
    if not found.get("curve/public-key"):
        raise CurveError(f"{path}: not a certificate: no curve/public-key")
    return found


def load_server_secret(path: Path) -> bytes:
    """
    The broker's secret key (Z85) from its secret certificate at C{path}.
    A certificate that others than its owner may read is refused: the
    error names it, with the command that mends it.
    """
    certificate = _certificate(path, _read(path))
    secret = certificate.get("curve/secret-key")
    if not secret:
        raise CurveError(f"{path}: no curve/secret-key (a public certificate, not the secret one?)")
    key = check_key(secret[-1], f"{path}: curve/secret-key")
    public = check_key(certificate["curve/public-key"][-1], f"{path}: curve/public-key")
    if zmq.curve_public(key) != public:
        raise CurveError(f"{path}: the public key is not the secret key's")
    try:
        mode = path.stat().st_mode
    except OSError:
        mode = 0
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CurveError(
            f"{path}: a secret certificate must be readable by its owner only (mode 0600),"
            f" and this one is {stat.S_IMODE(mode):04o}: chmod 600 {path}"
        )
    return key


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, Z85 (40 ASCII characters each); the secret is never logged."""

    public: bytes
    secret: bytes = field(repr=False)

    @classmethod
    def load(cls, path: Path) -> KeyPair:
        """The pair in the secret certificate at C{path} (see L{load_server_secret})."""
        secret = load_server_secret(path)
        return cls(zmq.curve_public(secret), secret)


@dataclass(frozen=True)
class LinkCurve:
    """
    A CURVE link between brokers (a pack's, a pair's): this broker's key
    pair on it, and the other brokers' public keys it admits (reloaded on
    SIGHUP, see L{malamute_pack.transport.security}).
    """

    keys: KeyPair
    allowed: KeyAllowList


def broker_key_pair(curve_secret: Path | None, data_dir: Path) -> KeyPair:
    """
    The broker's own key pair: C{curve_secret}'s (C{--curve-secret}), or
    the one made in C{data_dir} on the first start (L{server_secret}).
    """
    if curve_secret is not None:
        return KeyPair.load(curve_secret)
    secret, public = server_secret(data_dir)
    _log.info("CURVE: the broker's public certificate is {path}", path=str(public))
    return KeyPair(zmq.curve_public(secret), secret)


def _certificate_user(path: Path, certificate: dict[str, list[str]]) -> str:
    for key in ("metadata/user", "metadata/name"):
        if certificate.get(key):
            return certificate[key][-1]
    return path.name.removesuffix(".key")


def _key_lines(path: Path, text: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        # Z85 has "=" and "#" in its alphabet: split at the first "=" only.
        user, sep, key = stripped.partition("=")
        if not sep or not user.strip():
            raise CurveError(f"{path}:{number}: expected 'user = public-key'")
        found.append((user.strip(), key.strip().strip('"')))
    return found


def load_client_keys(path: Path) -> dict[bytes, str]:
    """
    The clients allowed in, from C{path} (a directory of certificates or
    one file, see the module): public key (Z85) to user.
    """
    named: list[tuple[Path, str, str]] = []  # where, user, key
    if path.is_dir():
        for file in sorted(path.glob("*.key")):
            certificate = _certificate(file, _read(file))
            user = _certificate_user(file, certificate)
            named.append((file, user, certificate["curve/public-key"][-1]))
    else:
        text = _read(path)
        if any(line.strip() == "curve" for line in text.splitlines()):
            certificate = _certificate(path, text)
            user = _certificate_user(path, certificate)
            named.append((path, user, certificate["curve/public-key"][-1]))
        else:
            named.extend((path, user, key) for user, key in _key_lines(path, text))
    keys: dict[bytes, str] = {}
    for where, user, key in named:
        if not user or user in RESERVED_USERS:
            raise CurveError(f"{where}: {user!r} cannot be a user")
        public = check_key(key, f"{where}: the key of {user!r}")
        if keys.get(public, user) != user:
            raise CurveError(f"{where}: the key of {user!r} is already {keys[public]!r}'s")
        keys[public] = user
    return keys


def write_certificates(directory: Path, name: str, user: str | None = None) -> tuple[Path, Path]:
    """
    Make a key pair and write it as C{NAME.key} (public) and
    C{NAME.key_secret} (mode 0600) in C{directory}; both paths.
    """
    public, secret = zmq.curve_keypair()
    directory.mkdir(parents=True, exist_ok=True)
    metadata = f'metadata\n    user = "{user}"\n' if user else ""
    public_file = directory / f"{name}.key"
    secret_file = directory / f"{name}.key_secret"
    header = "#   ZeroMQ CURVE {} certificate (malamute_pack)\n\n"
    public_file.write_text(
        header.format("Public") + metadata + f'curve\n    public-key = "{public.decode("ascii")}"\n'
    )
    descriptor = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(
            header.format("**Secret**")
            + metadata
            + f'curve\n    public-key = "{public.decode("ascii")}"\n'
            + f'    secret-key = "{secret.decode("ascii")}"\n'
        )
    return public_file, secret_file


SERVER_DIR = "curve"


def server_secret(data_dir: Path) -> tuple[bytes, Path]:
    """
    The broker's own CURVE secret key, from C{DATA_DIR/curve/server.key_secret},
    made there on the first call (the directory mode 0700, the secret file
    0600; the key is never printed); with the public certificate's path,
    to hand to clients.
    """
    directory = Path(data_dir) / SERVER_DIR
    secret_file = directory / "server.key_secret"
    if not secret_file.exists():
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            directory.chmod(0o700)
            write_certificates(directory, "server")
        except OSError as e:
            raise CurveError(f"cannot make the broker's CURVE keys in {directory}: {e}") from e
    return load_server_secret(secret_file), directory / "server.key"


def main(argv: Sequence[str]) -> int:
    """C{DIRECTORY NAME [USER]}: write a key pair there (see L{write_certificates})."""
    if not 2 <= len(argv) <= 3:
        print("usage: python -m malamute_pack.transport.curve DIRECTORY NAME [USER]")
        return 2
    public_file, secret_file = write_certificates(
        Path(argv[0]), argv[1], argv[2] if len(argv) == 3 else None
    )
    print(f"public certificate: {public_file}\nsecret certificate: {secret_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
