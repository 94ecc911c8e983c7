"""
Two clients exchange mailbox messages (blocking client): Alice writes to
Bob before Bob is connected; the broker keeps the letter and delivers it
when Bob connects; Bob confirms it (Alice hears the confirmation) and
answers.

Start a broker (``twistd -n malamute``), then, from the repository root::

    PYTHONPATH=. python examples/mailbox_exchange.py [--endpoint ipc://@/malamute]
"""

from __future__ import annotations

import argparse
import sys

from malamute_pack.client import BlockingClient


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Alice and Bob exchange letters.")
    parser.add_argument("--endpoint", default="ipc://@/malamute")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    with BlockingClient(args.endpoint, "alice") as alice:
        letter_id = alice.sendto("bob", "greeting", [b"Hello Bob!"], tracker="letter-1")
        print(f"alice: wrote to bob, who is not connected yet (stored as {letter_id})")
        with BlockingClient(args.endpoint, "bob") as bob:
            letter = bob.recv(timeout=args.timeout)
            if letter is None:
                print("bob: no letter arrived", file=sys.stderr)
                return 1
            print(f"bob: got {letter.subject!r} from {letter.sender}: {letter.content[0]!r}")
            # A tracked letter: the confirmation also tells the broker bob is done with it.
            bob.confirm(letter.tracker, 200, "read")
            bob.sendto(letter.sender, "re: " + letter.subject, [b"Hello Alice!"])
        confirmation = alice.recv_confirm(timeout=args.timeout)
        if confirmation is not None:
            print(
                f"alice: {confirmation.tracker} confirmed: {confirmation.status_code} "
                f"{confirmation.status_reason}"
            )
        answer = alice.recv(timeout=args.timeout)
        if answer is None:
            print("alice: no answer arrived", file=sys.stderr)
            return 1
        print(f"alice: got {answer.subject!r} from {answer.sender}: {answer.content[0]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
