"""
Tests for L{malamute_pack.transport.curve}: the broker's secret
certificate, the clients' keys (a directory of certificates, one
certificate, or C{user = key} lines) with their users, the key-making
command, and the client library's L{CurveKeys.load} on the same files.
"""

from __future__ import annotations

import io
import os
import stat
from contextlib import redirect_stdout
from pathlib import Path

import zmq
import zmq.auth
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.options import CurveKeys
from malamute_pack.transport.curve import (
    CurveError,
    KeyPair,
    check_key,
    load_client_keys,
    load_server_secret,
    main,
    server_secret,
    write_certificates,
)


class ServerSecretTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = Path(self.mktemp())

    def test_readsItsOwnCertificates(self) -> None:
        """
        The secret certificate our command writes (mode 0600) gives the
        secret key, which is the public certificate's pair.
        """
        public_file, secret_file = write_certificates(self.directory, "server")
        self.assertEqual(stat.S_IMODE(secret_file.stat().st_mode), 0o600)
        secret = load_server_secret(secret_file)
        public, _ = zmq.auth.load_certificate(str(public_file))
        self.assertEqual(zmq.curve_public(secret), public)

    def test_readsPyzmqCertificates(self) -> None:
        """
        A secret certificate written by pyzmq's zmq.auth (as zcert writes
        them) is read, once readable by its owner only.
        """
        self.directory.mkdir()
        _, secret_file = zmq.auth.create_certificates(str(self.directory), "server")
        os.chmod(secret_file, 0o600)
        _, secret = zmq.auth.load_certificate(secret_file)
        self.assertEqual(load_server_secret(Path(secret_file)), secret)

    def test_othersMayNotReadIt(self) -> None:
        """
        A secret certificate that its group or others may read (or write) is
        refused, naming the file, its mode and the command that mends it.
        """
        _, secret_file = write_certificates(self.directory, "server")
        for mode in (0o640, 0o604, 0o620, 0o644):
            secret_file.chmod(mode)
            with self.assertRaises(CurveError) as ctx:
                load_server_secret(secret_file)
            self.assertIn(f"chmod 600 {secret_file}", str(ctx.exception))
            self.assertIn(f"{mode:04o}", str(ctx.exception))
        secret_file.chmod(0o400)
        self.assertEqual(KeyPair.load(secret_file).secret, load_server_secret(secret_file))

    def test_refused(self) -> None:
        """
        A public certificate, a file that is not a certificate, a missing
        file, a key that is not Z85, and a mismatched pair are clear errors.
        """
        public_file, secret_file = write_certificates(self.directory, "server")
        bad = self.directory / "bad"
        cases = [
            (public_file, None, "no curve/secret-key"),
            (bad, "hello = world\n", "no curve/public-key"),
            (self.directory / "missing", None, "cannot read"),
            (bad, 'curve\n    public-key = "short"\n    secret-key = "x"\n', "not a CURVE key"),
        ]
        other_public, _ = zmq.curve_keypair()
        text = secret_file.read_text()
        mismatched = text.replace(
            text.split('public-key = "')[1].split('"')[0], other_public.decode()
        )
        cases.append((bad, mismatched, "not the secret key's"))
        for path, content, fragment in cases:
            if content is not None:
                path.write_text(content)
            with self.assertRaises(CurveError) as ctx:
                load_server_secret(path)
            self.assertIn(fragment, str(ctx.exception))

    def test_checkKey(self) -> None:
        """check_key takes 40 characters of Z85 and nothing else."""
        public, _ = zmq.curve_keypair()
        self.assertEqual(check_key(public.decode(), "k"), public)
        for bad in ("", "x" * 40 + "y", "\u00e9" * 40, '"' * 40):
            self.assertRaises(CurveError, check_key, bad, "k")


class DataDirKeyTests(SynchronousTestCase):
    def test_madeOnceAndKept(self) -> None:
        """
        Without a configured secret the broker's key pair is made in
        DATA/curve on the first call (directory 0700, secret 0600), and
        read back, the same, afterwards; the public certificate holds no
        secret.
        """
        data = Path(self.mktemp())
        secret, public_file = server_secret(data)
        self.assertEqual(server_secret(data), (secret, public_file))
        directory = data / "curve"
        self.assertEqual(stat.S_IMODE(directory.stat().st_mode), 0o700)
        self.assertEqual(stat.S_IMODE((directory / "server.key_secret").stat().st_mode), 0o600)
        self.assertEqual(public_file, directory / "server.key")
        public, none = zmq.auth.load_certificate(str(public_file))
        self.assertIsNone(none)
        self.assertEqual(zmq.curve_public(secret), public)

    def test_unusableDataDir(self) -> None:
        """A data directory that cannot hold the keys is a CurveError naming it."""
        blocker = Path(self.mktemp())
        blocker.write_text("a file, not a directory")
        with self.assertRaises(CurveError) as ctx:
            server_secret(blocker)
        self.assertIn(str(blocker), str(ctx.exception))


class ClientKeysTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = Path(self.mktemp())
        self.directory.mkdir()

    def test_directoryOfCertificates(self) -> None:
        """
        Every *.key file in a directory is a client: its user is its
        metadata/user, else metadata/name, else the file name; secret
        certificates and other files are skipped.
        """
        alice, _ = write_certificates(self.directory, "a1", "alice")
        write_certificates(self.directory, "bob")
        named = self.directory / "c.key"
        carol, _ = zmq.curve_keypair()
        named.write_text(
            f'metadata\n    name = "carol"\ncurve\n    public-key = "{carol.decode()}"\n'
        )
        (self.directory / "notes.txt").write_text("not a key")
        keys = load_client_keys(self.directory)
        by_user = {user: key for key, user in keys.items()}
        self.assertEqual(set(by_user), {"alice", "bob", "carol"})
        self.assertEqual(by_user["carol"], carol)
        self.assertEqual(by_user["alice"], zmq.auth.load_certificate(str(alice))[0])

    def test_oneCertificateOrKeyLines(self) -> None:
        """
        A file with a curve section is one certificate; any other file is
        C{user = key} lines, where a key may hold "=" and "#" (Z85 does).
        """
        public_file, _ = write_certificates(self.directory, "dave", "dave")
        self.assertEqual(list(load_client_keys(public_file).values()), ["dave"])
        lines = self.directory / "clients"
        key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # libzmq's test key
        other = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
        lines.write_text(f"# clients\nalice = {key}\n\nbob={other}\nalice = {other[:-1]}#\n")
        keys = load_client_keys(lines)
        self.assertEqual(keys[key.encode()], "alice")
        self.assertEqual(keys[other.encode()], "bob")
        self.assertEqual(keys[(other[:-1] + "#").encode()], "alice")

    def test_refused(self) -> None:
        """
        A key given to two users, a reserved user name, a line that is not
        C{user = key}, and a bad key are clear errors.
        """
        key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
        path = self.directory / "clients"
        for text, fragment in [
            (f"alice = {key}\nbob = {key}\n", "already 'alice''s"),
            (f"* = {key}\n", "cannot be a user"),
            (f"- = {key}\n", "cannot be a user"),
            ("alice\n", ":1: expected"),
            ("alice = nope\n", "not a CURVE key"),
        ]:
            path.write_text(text)
            with self.assertRaises(CurveError) as ctx:
                load_client_keys(path)
            self.assertIn(fragment, str(ctx.exception))
        self.assertRaises(CurveError, load_client_keys, self.directory / "missing")


class CommandTests(SynchronousTestCase):
    def test_makesAPairForTheClientLibrary(self) -> None:
        """
        The command writes a key pair; the client library's CurveKeys.load
        reads it with the broker's public certificate; usage errors exit 2.
        """
        directory = Path(self.mktemp())
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(main([str(directory), "server"]), 0)
            self.assertEqual(main([str(directory), "alice", "alice"]), 0)
            self.assertEqual(main([]), 2)
        self.assertIn("alice.key_secret", out.getvalue())
        keys = CurveKeys.load(directory / "server.key", directory / "alice.key_secret")
        self.assertEqual(
            keys.server.encode(),
            zmq.curve_public(load_server_secret(directory / "server.key_secret")),
        )
        self.assertEqual(load_client_keys(directory / "alice.key"), {keys.public.encode(): "alice"})
        self.assertRaises(
            ValueError, CurveKeys.load, directory / "server.key", directory / "alice.key"
        )
