"""
Playing one scenario against one broker, whatever its kind: the roles of
a scenario once (L{malamute_pack.bench.scenarios.run}), the latency
scenario once per rate, the scale scenario with its swarms
(L{malamute_pack.bench.scale}). Both the plain benchmark and the
comparison (L{malamute_pack.bench.compare}) play through L{play}.

Tests: ``tests/system/test_bench_compare.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.context import BaseContext

from malamute_pack.bench import scale
from malamute_pack.bench.load import DEFAULT_WINDOW, Job
from malamute_pack.bench.scenarios import (
    DEFAULT_RATES,
    LATENCY,
    SCALE,
    BenchError,
    Measured,
    Scenario,
    default_messages,
    run,
)

# Seconds between the pings of each of scale's idle clients, for a broker
# that expires silent clients: the load processes' own interval.
IDLE_PING_INTERVAL = Job(1).ping_interval


@dataclass(frozen=True, slots=True)
class Target:
    """
    A broker to play against.

    @ivar journal: whether it journals, when the harness started it; else None.
    @ivar broker: its name in a comparison's lines (ours, other); else None.
    @ivar pid: its process, for scale's RSS figures, if known.
    @ivar extensions: whether it speaks our extensions (protocol version 2).
    @ivar ping_idle: whether scale's idle clients ping it: a broker that
        expires silent clients (the C broker, any external one); the bench's
        own brokers run with a heartbeat timeout longer than any run.
    """

    endpoint: str
    journal: bool | None = None
    broker: str | None = None
    pid: int | None = None
    extensions: bool = True
    ping_idle: bool = False


@dataclass(frozen=True, slots=True)
class Choices:
    """
    What the command line chose for every play.

    @ivar messages: n of every run, if given (else each scenario's default).
    @ivar window: mailbox_durable's window.
    @ivar rates: the latency scenario's rates.
    @ivar clients, subscriptions: the scale scenario's idle clients and
        their subscriptions in all.
    """

    messages: int | None = None
    window: int = DEFAULT_WINDOW
    rates: tuple[int, ...] = DEFAULT_RATES
    clients: int = scale.DEFAULT_CLIENTS
    subscriptions: int = scale.DEFAULT_SUBSCRIPTIONS


def skip_reason(scenario: Scenario, target: Target) -> str:
    """Why C{target} cannot play C{scenario}; empty if it can."""
    if scenario.extension and not target.extensions:
        return scenario.extension
    if scenario.name == SCALE and target.pid is None:
        return "needs the broker's pid for its memory figures (--broker-pid)"
    return ""


def play(
    scenario: Scenario, target: Target, choices: Choices, context: BaseContext
) -> Iterator[Measured]:
    """
    Play C{scenario} against C{target}: each result as soon as it is
    measured (one per rate for latency).

    @raise BenchError: it failed, or C{target} cannot play it (L{skip_reason}).
    """
    reason = skip_reason(scenario, target)
    if reason:
        raise BenchError(f"{scenario.name} cannot run here: {reason}")
    if scenario.name == SCALE:
        assert target.pid is not None
        yield scale.measure(
            target.endpoint,
            target.pid,
            context,
            clients=choices.clients,
            subscriptions=choices.subscriptions,
            n=choices.messages or scenario.default_n,
            ping_interval=IDLE_PING_INTERVAL if target.ping_idle else None,
            journal=target.journal,
            broker=target.broker,
        )
        return
    for rate in choices.rates if scenario.name == LATENCY else (0,):
        job = Job(
            choices.messages or default_messages(scenario, rate), window=choices.window, rate=rate
        )
        yield run(scenario, target.endpoint, job, context, target.journal, target.broker)
