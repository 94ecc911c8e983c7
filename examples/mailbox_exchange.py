"""
Two clients exchange mailbox messages (blocking client): Alice writes to
Bob before Bob is connected; the broker keeps the letter and delivers it
when Bob connects; Bob confirms it (Alice hears the confirmation) and
answers.

Start a broker (``scripts/broker``), then, from the repository root::

    .venv/bin/python examples/mailbox_exchange.py [-e ipc://@/malamute] [--user USER]

With ``--user``, both clients authenticate with PLAIN, the password taken
from the environment variable ``MALAMUTE_PASSWORD``.
"""

from __future__ import annotations

import argparse
import sys

from malamute_pack.client import BlockingClient, ClientError, plain_credentials


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Alice and Bob exchange letters.")
    parser.add_argument("-e", "--endpoint", default="ipc://@/malamute", help="the broker")
    parser.add_argument(
        "--user", help="PLAIN user (the password from the environment: MALAMUTE_PASSWORD)"
    )
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    try:
        plain = plain_credentials(args.user)
    except ValueError as e:
        parser.error(str(e))
    try:
        return exchange(args.endpoint, args.timeout, plain)
    except ClientError as e:
        print(f"mailbox_exchange: {e}", file=sys.stderr)
        return 1


def exchange(endpoint: str, timeout: float, plain: tuple[str, str] | None) -> int:
    with BlockingClient(endpoint, "alice", plain=plain) as alice:
        letter_id = alice.sendto("bob", "greeting", [b"Hello Bob!"], tracker="letter-1")
        print(f"alice: wrote to bob, who is not connected yet (stored as {letter_id})")
        with BlockingClient(endpoint, "bob", plain=plain) as bob:
            letter = bob.recv(timeout=timeout)
            if letter is None:
                print("bob: no letter arrived", file=sys.stderr)
                return 1
            print(f"bob: got {letter.subject!r} from {letter.sender}: {letter.content[0]!r}")
            # A tracked letter: the confirmation also tells the broker bob is done with it.
            bob.confirm(letter.tracker, 200, "read")
            bob.sendto(letter.sender, "re: " + letter.subject, [b"Hello Alice!"])
        confirmation = alice.recv_confirm(timeout=timeout)
        if confirmation is not None:
            print(
                f"alice: {confirmation.tracker} confirmed: {confirmation.status_code} "
                f"{confirmation.status_reason}"
            )
        answer = alice.recv(timeout=timeout)
        if answer is None:
            print("alice: no answer arrived", file=sys.stderr)
            return 1
        print(f"alice: got {answer.subject!r} from {answer.sender}: {answer.content[0]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
