"""
C{scripts/soak}: a soak of real brokers under random, seeded faults
(``python -m soak``, run by C{scripts/soak} with the checkout on the path).

    scripts/soak --topology pair --seed 7 --minutes 30
    scripts/soak --topology pack3 --seed 1 --seconds 20 --keep

It needs root (network namespaces, iptables, tmpfs mounts) and the C{ip}
and C{iptables} commands: without them it says so and exits 2. It exits 0
when the checker found no violation (printing the figures), 1 when it
found some (printing them, the run directory with the history, and the
command that replays the seed), 2 when the soak could not run, 130 when
interrupted. See L{soak.run} for what a run does.

Tests: ``tests/system/test_soak.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from soak.nemesis import KINDS
from soak.run import QUIET, Settings, recheck, run
from soak.topology import TOPOLOGIES


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/soak",
        description="Run real brokers in network namespaces under random, seeded faults "
        "(kill -9, pauses, cut links, full disks, damaged journals, restarts) with clients "
        "that append, send letters and requests and consume; then check that nothing "
        "acknowledged was lost (docs/architecture.md, 'The soak'). Needs root.",
    )
    length = p.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="minutes of load and faults (default 1)")
    length.add_argument("--seconds", type=float, help="seconds of load and faults")
    p.add_argument("--seed", type=int, default=1, help="the fault schedule's seed (default 1)")
    p.add_argument("--topology", choices=TOPOLOGIES, default="pair", help="default: pair")
    p.add_argument("--out", type=Path, default=Path("soak-out"), help="default: ./soak-out")
    p.add_argument("--keep", action="store_true", help="keep the run directory when it passes")
    p.add_argument("--slot", type=int, help="the namespace/subnet slot (default: a free one)")
    p.add_argument(
        "--fault-interval", type=float, default=6.0, help="mean seconds between faults (6)"
    )
    p.add_argument("--pause", type=float, default=0.1, help="seconds between a client's ops (0.1)")
    p.add_argument("--disk-mb", type=int, default=128, help="each broker's tmpfs, MiB (128)")
    p.add_argument("--broker-rss-mb", type=int, default=512, help="a broker's memory bound (512)")
    p.add_argument("--client-rss-mb", type=int, default=256, help="a client's memory bound (256)")
    p.add_argument(
        "--quiet", type=float, default=QUIET, help=f"seconds of quiet before the reads ({QUIET:g})"
    )
    p.add_argument(
        "--check",
        type=Path,
        metavar="RUN_DIR",
        help="check a kept run directory again (no root needed; runs nothing)",
    )
    p.add_argument(
        "--faults",
        default=",".join(KINDS),
        help=f"the kinds of fault, separated by commas (default all: {','.join(KINDS)})",
    )
    return p


def missing_requirements() -> str | None:
    """Why this machine cannot run a soak, or None."""
    if os.geteuid() != 0:
        return "the soak needs root (network namespaces, iptables, tmpfs mounts): run it as root"
    for command in ("ip", "iptables", "mount"):
        if shutil.which(command) is None:
            return f"the soak needs the {command} command (apt-get install iproute2 iptables)"
    return None


def settings_of(args: argparse.Namespace) -> Settings:
    seconds = args.seconds if args.seconds is not None else 60.0 * (args.minutes or 1.0)
    extra: list[str] = []
    defaults = parser().parse_args([])
    options = ("fault_interval", "pause", "disk_mb", "broker_rss_mb", "client_rss_mb", "quiet")
    for option in options:
        if getattr(args, option) != getattr(defaults, option):
            extra += [f"--{option.replace('_', '-')}", f"{getattr(args, option):g}"]
    kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    if kinds != KINDS:
        extra += ["--faults", ",".join(kinds)]
    return Settings(
        topology=args.topology,
        seed=args.seed,
        seconds=seconds,
        out=args.out,
        keep=args.keep,
        slot=args.slot,
        interval=args.fault_interval,
        pause=args.pause,
        disk_mb=args.disk_mb,
        broker_rss_mb=args.broker_rss_mb,
        client_rss_mb=args.client_rss_mb,
        quiet=args.quiet,
        kinds=kinds,
        extra=tuple(extra),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.check is not None:
        return recheck(args.check)
    why = missing_requirements()
    if why is not None:
        print(f"soak: {why}", file=sys.stderr)
        return 2
    try:
        return run(settings_of(args))
    except (RuntimeError, OSError, ValueError) as e:
        print(f"soak: could not run: {e}", file=sys.stderr)
        return 2
    except Exception:
        # A fault of the soak itself, not a violation: never exit 1 for it.
        traceback.print_exc()
        print("soak: the soak itself failed (above); its run directory is kept", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
