"""
The C{malamute} command: its options (argparse), and the one place that
turns every failure into one line on stderr and an exit status: 1 for a
failure (C{malamute: error: ...}, what went wrong and how to fix it), 2 for
a usage error (argparse's), 130 on Ctrl-C and 143 on SIGTERM (quietly,
after closing the connection). Never a traceback.

    malamute publish weather temp.paris 21.5
    malamute tail weather 'temp\\.' --from earliest --count 10
    malamute status

Global options (before or after the command): C{-e/--endpoint} (a comma
list for a pair; C{MALAMUTE_ENDPOINT}, default C{ipc://@/malamute}),
C{--user} (C{MALAMUTE_USER}; the password from C{MALAMUTE_PASSWORD} or
C{--password-file}, never from the command line), C{--curve-server-key}
and C{--curve-keys} (C{MALAMUTE_CURVE_SERVER_KEY}, C{MALAMUTE_CURVE_KEYS}),
C{--address} (C{MALAMUTE_ADDRESS}), C{--timeout} (connect, 5 s).

Tests: ``tests/system/test_cli.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from malamute_pack.cli import commands, serve, transfer
from malamute_pack.cli.connection import (
    DEFAULT_ENDPOINT,
    DEFAULT_TIMEOUT,
    ConnectionSettings,
    explain,
    settings_from,
)
from malamute_pack.cli.errors import CommandError
from malamute_pack.cli.positions import EARLIEST, LAST_VALUES, LATEST, parse_position
from malamute_pack.cli.views import SECTIONS
from malamute_pack.client.errors import ClientError

PROGRAM = "malamute"
ALL_SUBJECTS = ".*"


class Terminated(BaseException):
    """SIGTERM arrived: unwind like Ctrl-C (connections close on the way)."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


class _RefusePassword(argparse.Action):
    """C{--password}: refused, saying where a password comes from."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            "a password is never taken from the command line (others can read it there): "
            "set MALAMUTE_PASSWORD or give --password-file"
        )


def _connection_options(parser: argparse.ArgumentParser, *, timeout: bool) -> None:
    """The options every command takes (see the module); C{timeout}: with --timeout."""
    group = parser.add_argument_group("connection")
    group.add_argument(
        "-e",
        "--endpoint",
        metavar="EP",
        help=f"the broker's endpoint(s), comma-separated (MALAMUTE_ENDPOINT; {DEFAULT_ENDPOINT})",
    )
    group.add_argument("--user", help="PLAIN user (MALAMUTE_USER); password: MALAMUTE_PASSWORD")
    group.add_argument("--password-file", metavar="FILE", help="read the PLAIN password from FILE")
    group.add_argument("--password", action=_RefusePassword, help=argparse.SUPPRESS)
    group.add_argument(
        "--curve-server-key",
        metavar="KEY",
        help="the broker's CURVE public key, Z85 or its certificate file "
        "(MALAMUTE_CURVE_SERVER_KEY)",
    )
    group.add_argument(
        "--curve-keys",
        metavar="FILE",
        help="this client's CURVE secret certificate (MALAMUTE_CURVE_KEYS)",
    )
    group.add_argument(
        "--address",
        help="this client's address (MALAMUTE_ADDRESS; default a unique malamute-cli.HOST.PID.X)",
    )
    if timeout:
        group.add_argument(
            "--timeout",
            type=_seconds,
            metavar="S",
            help=f"seconds to wait for the broker to answer a connect ({DEFAULT_TIMEOUT:g})",
        )


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        allow_abbrev=False,
        description="Publish, tail, send, receive, request, serve and watch a Malamute broker.",
    )
    _connection_options(parser, timeout=True)
    # The same options after the command: unset there unless given.
    common = argparse.ArgumentParser(
        add_help=False, allow_abbrev=False, argument_default=argparse.SUPPRESS
    )
    _connection_options(common, timeout=True)
    common_no_timeout = argparse.ArgumentParser(
        add_help=False, allow_abbrev=False, argument_default=argparse.SUPPRESS
    )
    _connection_options(common_no_timeout, timeout=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(
        name: str, text: str, *, own_timeout: bool = False, more: str = ""
    ) -> argparse.ArgumentParser:
        parents = [common_no_timeout if own_timeout else common]
        return sub.add_parser(
            name, help=text, description=text + more, parents=parents, allow_abbrev=False
        )

    p = command("publish", "publish a message to a stream")
    p.add_argument("stream")
    p.add_argument("subject")
    p.add_argument("body", nargs="?", help="the body; - or none: read stdin")
    p.add_argument("--lines", action="store_true", help="publish each line of stdin")

    p = command("tail", "print a stream's messages as they come")
    p.add_argument("stream")
    p.add_argument("pattern", nargs="?", default=ALL_SUBJECTS, help="subjects (a regex; all)")
    p.add_argument(
        "--from",
        dest="start",
        type=parse_position,
        default=None,
        metavar="POS",
        help="earliest, latest (default), a sequence number, or a time "
        "(ISO 8601, or Unix seconds as @SECONDS); with --consumer, resets the consumer there",
    )
    p.add_argument(
        "--last-values",
        dest="start",
        action="store_const",
        const=LAST_VALUES,
        help="a last-value stream: the latest message of each subject first, then as they come",
    )
    p.add_argument("--json", action="store_true", help="one JSON object a message")
    p.add_argument("--count", type=_positive_int, metavar="N", help="stop after N messages")
    p.add_argument(
        "--consumer",
        metavar="NAME",
        help="read as the durable consumer NAME: from after its last commit (the broker keeps "
        "it), committing what was printed every second and at the end",
    )
    p.add_argument(
        "--group",
        metavar="NAME",
        help="read as a member of the consumer group NAME (member --consumer, or one named "
        "after this process): each record to one member of the group, committed as printed",
    )

    p = command("send", "send a letter to a mailbox")
    p.add_argument("address_to", metavar="ADDRESS")
    p.add_argument("subject")
    p.add_argument("body", nargs="?", help="the body; - or none: read stdin")

    p = command("recv", "take the letters of a mailbox")
    p.add_argument("mailbox", metavar="ADDRESS")
    p.add_argument("--json", action="store_true", help="one JSON object a letter")
    p.add_argument("--count", type=_positive_int, metavar="N", help="stop after N letters")

    p = command("request", "send a request to a service and print the reply", own_timeout=True)
    p.add_argument("service")
    p.add_argument("subject")
    p.add_argument("body", nargs="?", help="the body; - or none: read stdin")
    p.add_argument(
        "--timeout",
        dest="wait",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="seconds to wait for the reply (10)",
    )

    p = command(
        "serve",
        "answer a service's requests by running a command",
        own_timeout=True,
        more=": the request's body on its stdin, the reply its stdout (a non-zero exit "
        "replies subject error with its stderr)",
    )
    p.usage = f"{PROGRAM} serve [options] SERVICE -- COMMAND [ARG ...]"
    p.add_argument("service")
    p.add_argument("--pattern", default=ALL_SUBJECTS, help="request subjects to serve (all)")
    p.add_argument(
        "--timeout",
        dest="wait",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="seconds a request's command may run (30)",
    )
    p.add_argument("--count", type=_positive_int, metavar="N", help="stop after N requests")

    for name, section in SECTIONS.items():
        p = command(name, f"the broker's {section} (from its $broker service)")
        p.add_argument("--json", action="store_true", help="the JSON as the broker sends it")

    p = command("export", "write a stream's records to a file (JSON lines, or .parquet)")
    p.add_argument("stream")
    p.add_argument("file", help="where to write (- for stdout)")
    p.add_argument("--from", dest="start", type=parse_position, default=EARLIEST, metavar="POS")
    p.add_argument("--to", dest="stop", type=parse_position, default=LATEST, metavar="POS")
    p.add_argument("--pattern", default="", help="only subjects this finds (a regex; all)")
    p.add_argument("--progress", action="store_true", help="a progress bar even if not a tty")

    p = command("import", "append a file's records to a stream (subjects and bodies kept)")
    p.add_argument("file", help="JSON lines or .parquet, as export writes (- for stdin)")
    p.add_argument("stream")
    p.add_argument("--key", help="the prefix of the append keys (default: from the content)")
    p.add_argument("--progress", action="store_true", help="a progress bar even if not a tty")
    return parser


def _settings(args: argparse.Namespace) -> ConnectionSettings:
    return settings_from(
        endpoint=args.endpoint,
        timeout=args.timeout,
        user=args.user,
        password_file=args.password_file,
        curve_server_key=args.curve_server_key,
        curve_keys=args.curve_keys,
        address=args.address,
        environ=os.environ,
    )


def split_serve_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """
    For C{serve}, the arguments before C{--} and the command after it
    (argparse would take the command's own options for ours); else
    C{argv} and None.
    """
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    if "serve" not in argv[:cut]:
        return argv, None
    return argv[:cut], argv[cut + 1 :]


def dispatch(args: argparse.Namespace, settings: ConnectionSettings) -> int:
    """Run the command C{args} name; its exit status."""
    name = args.command
    if name == "publish":
        if args.lines:
            return commands.publish_lines(settings, args.stream, args.subject)
        return commands.publish(settings, args.stream, args.subject, args.body)
    if name == "tail":
        return commands.tail(
            settings,
            args.stream,
            args.pattern,
            args.start,
            args.json,
            args.count,
            args.consumer,
            args.group,
        )
    if name == "send":
        return commands.send(settings, args.address_to, args.subject, args.body)
    if name == "recv":
        return commands.recv(settings, args.mailbox, args.json, args.count)
    if name == "request":
        return commands.request(settings, args.service, args.subject, args.body, args.wait)
    if name == "serve":
        return serve.serve(settings, args.service, args.pattern, args.run, args.wait, args.count)
    if name in SECTIONS:
        return commands.section(settings, SECTIONS[name], args.json)
    if name == "export":
        return transfer.export(
            settings, args.stream, args.start, args.stop, args.file, args.pattern, args.progress
        )
    if name == "import":
        return transfer.import_file(settings, args.file, args.stream, args.key, args.progress)
    raise AssertionError(f"unknown command {name}")


def _fail(message: str, status: int = 1) -> int:
    print(f"{PROGRAM}: error: {message}", file=sys.stderr, flush=True)
    return status


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    """Run C{malamute} with C{argv} (else the process's arguments); the exit status."""
    parser = build_parser()
    words, run = split_serve_command(sys.argv[1:] if argv is None else list(argv))
    try:
        args = parser.parse_args(words)
        if args.command == "serve" and not run:
            parser.error("serve needs a command after --: malamute serve SERVICE -- COMMAND")
    except SystemExit as e:  # --help, or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    args.run = run
    previous: Callable[[int, FrameType | None], Any] | int | None = None
    with contextlib.suppress(ValueError):  # not the main thread: SIGTERM keeps its handler
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    settings: ConnectionSettings | None = None
    try:
        settings = _settings(args)
        return dispatch(args, settings)
    except CommandError as e:
        return _fail(str(e), e.status)
    except ClientError as e:
        assert settings is not None
        return _fail(explain(e, settings, connected=True))
    except KeyboardInterrupt:
        return 130
    except Terminated:
        return 143
    except BrokenPipeError:
        # The reader went away (`malamute tail s | head`): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
