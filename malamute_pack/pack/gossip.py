"""
zgossip in the reactor: the gossip node of one process (CZMQ's zgossip,
which Zyre uses for discovery where there is no broadcast), with no threads.

Three parts, each with one job:

- L{GossipTable}: the tuples (key to value), bounded; pure logic.
- L{GossipCore}: the protocol, with no socket: an optional server side (the
  clients that said HELLO, by routing id) and any number of remotes (servers
  this node is a client of), sharing one table. It sends through callbacks
  and takes time from an injected clock.
- L{Gossip}: thin socket glue: a ROUTER for the server, a DEALER per remote
  (through L{ZmqSocket}), and the two timers (PING, client expiry).

The rules (``notes/zre.md``, checked against CZMQ): a client says HELLO then
publishes all its tuples; the server answers HELLO with all of its tuples. A
new or changed tuple, from anywhere, is stored, handed to the application
(unless it published it itself) and forwarded to every client (the sender
included: the server echoes) and every remote but the one it came from; a
duplicate is dropped. A client that never said HELLO, or was forgotten
after C{client_timeout} of silence, gets INVALID, and answers it with HELLO
and all its tuples again; so a client PINGs often (the C server forgets a
client silent ~1 s).

A send that fails (a peer's queue full) is healed by that rule: a client
the server cannot reach is forgotten and resynchronised at its next PING;
a remote we could not reach gets HELLO and all tuples at the next tick.

With CURVE (a CURVE pack, as zyre's C{zyre_gossip_connect_curve}), the
server is a CURVE server whose ZAP domain admits only the listed keys, and
what a client whose key is no longer listed (a reload) sends is dropped;
each remote is given as C{ENDPOINT|PUBLIC_KEY} (the server's key, Z85)
and reached as a CURVE client with this node's key pair.

Tests: ``tests/unit/test_pack_gossip.py``.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.protocol.zgossip import (
    MAX_KEY_BYTES,
    GossipMessage,
    Hello,
    Invalid,
    MalformedGossip,
    Ping,
    Pong,
    Publish,
    decode,
    encode,
)
from malamute_pack.transport.curve import LinkCurve
from malamute_pack.transport.zap import PACK_DOMAIN
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

_HELLO = encode(Hello())
_PING = encode(Ping())
_PONG = encode(Pong())
_INVALID = encode(Invalid())

# Largest frame a gossip socket accepts; a peer sending more is disconnected
# by ZeroMQ. Generous next to the table's bounds: a tuple between those and
# this is refused and counted instead.
MAX_FRAME_BYTES = 64 * 1024


# Table


class GossipTable:
    """
    The tuples, key to value, bounded in count and size; what does not fit
    is refused and counted, never stored.

    @ivar refused: tuples refused for a bound.
    """

    def __init__(
        self, max_tuples: int = 10_000, max_key_bytes: int = 255, max_value_bytes: int = 1024
    ) -> None:
        """
        @param max_key_bytes: at most 255, what the protocol can carry.
        """
        if not 0 < max_key_bytes <= MAX_KEY_BYTES:
            raise ValueError(f"max_key_bytes must be 1 to {MAX_KEY_BYTES}, not {max_key_bytes}")
        self.max_tuples = max_tuples
        self.max_key_bytes = max_key_bytes
        self.max_value_bytes = max_value_bytes
        self.refused = 0
        self._tuples: dict[str, str] = {}

    def refusal(self, key: str, value: str) -> str | None:
        """Why C{key}, C{value} would be refused, or None if it fits."""
        try:
            key_bytes = len(key.encode("utf-8"))
            value_bytes = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            return "not encodable as UTF-8"
        if key_bytes > self.max_key_bytes:
            return f"key of {key_bytes} bytes, at most {self.max_key_bytes}"
        if value_bytes > self.max_value_bytes:
            return f"value of {value_bytes} bytes, at most {self.max_value_bytes}"
        if key not in self._tuples and len(self._tuples) >= self.max_tuples:
            return f"table full ({self.max_tuples} tuples)"
        return None

    def store(self, key: str, value: str) -> bool:
        """
        Store C{key} = C{value}.

        @return: True when the tuple is new or changed a value; False for a
            duplicate or a tuple refused (counted in L{refused}).
        """
        if self._tuples.get(key) == value:
            return False
        if self.refusal(key, value) is not None:
            self.refused += 1
            return False
        self._tuples[key] = value
        return True

    def get(self, key: str) -> str | None:
        """The value of C{key}, or None."""
        return self._tuples.get(key)

    def items(self) -> list[tuple[str, str]]:
        """Every tuple, oldest key first (a copy: safe to hold while storing)."""
        return list(self._tuples.items())

    def __len__(self) -> int:
        return len(self._tuples)


# Protocol


@dataclass(slots=True)
class GossipCounters:
    """What a gossip node has seen and done, for metrics and tests."""

    received: int = 0  # well-formed messages received
    malformed: int = 0  # frames dropped as not zgossip
    refused: int = 0  # tuples refused by the table's bounds (network or local)
    duplicates: int = 0  # tuples already held, received or published again
    delivered: int = 0  # tuples handed to the application
    forwarded: int = 0  # PUBLISH messages sent
    invalid_sent: int = 0  # INVALID sent to clients we did not know
    invalid_received: int = 0  # INVALID from servers that forgot us
    unexpected: int = 0  # well-formed messages the receiving side never takes
    expired: int = 0  # clients forgotten after client_timeout of silence
    send_failed: int = 0  # sends refused by a full queue or a vanished client
    clients_refused: int = 0  # HELLOs of new clients past max_clients


# Clients a gossip server keeps at once (each costs a table entry here and a
# connection with its queues in ZeroMQ).
MAX_CLIENTS = 10_000

SendToClient = Callable[[bytes, bytes], bool]  # (routing id, frame) -> sent
SendToRemote = Callable[[bytes], bool]  # frame -> sent


@dataclass(slots=True)
class _Remote:
    send: SendToRemote
    last_heard: float | None = None
    resync: bool = False  # a send failed: HELLO and all tuples again at the next tick


class GossipCore:
    """
    The zgossip protocol of one node, with no socket: the server side (if
    C{send_to_client} is given) and the remotes share one table.

    Feed it what arrives (L{from_client}, L{from_remote}) and tick it
    (L{ping} every ping interval, L{expire} now and then).
    """

    def __init__(
        self,
        clock: IReactorTime,
        on_tuple: Callable[[str, str], None],
        send_to_client: SendToClient | None = None,
        client_timeout: float = 30.0,
        table: GossipTable | None = None,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        """
        @param max_clients: clients the server side keeps at once; a new
            one past them is refused (counted) until others expire.
        """
        self._clock = clock
        self.max_clients = max_clients
        self._on_tuple = on_tuple
        self._send_to_client = send_to_client
        self.client_timeout = client_timeout
        self.table = GossipTable() if table is None else table
        self.counters = GossipCounters()
        self._clients: dict[bytes, float] = {}  # routing id: last heard
        self._remotes: dict[str, _Remote] = {}
        self._logs = LogLimit(clock, _log)

    # Application side

    def publish(self, key: str, value: str) -> bool:
        """
        A tuple of this node: stored and sent to every client and remote
        (not handed back to the application).

        @return: True if new or changed; False for a duplicate or a tuple
            refused by the table's bounds.
        """
        return self._accept(key, value, deliver=False)

    @property
    def clients(self) -> list[bytes]:
        """The routing ids of the clients that said HELLO and are not forgotten."""
        return list(self._clients)

    def remote_last_heard(self, name: str) -> float | None:
        """When remote C{name} last sent anything, or None if never."""
        return self._remotes[name].last_heard

    # Remotes (this node as a client)

    def add_remote(self, name: str, send: SendToRemote) -> None:
        """Start a session with the server C{name}: HELLO, then all our tuples."""
        if name in self._remotes:
            raise ValueError(f"already a client of {name}")
        remote = self._remotes[name] = _Remote(send)
        self._hello(remote)

    def remove_remote(self, name: str) -> None:
        """Forget the server C{name}."""
        self._remotes.pop(name, None)

    def from_remote(self, name: str, frames: Sequence[bytes]) -> None:
        """One message from the server C{name}."""
        remote = self._remotes.get(name)
        if remote is None:
            return
        message = self._decode(frames, 1, name)
        if message is None:
            return
        remote.last_heard = self._clock.seconds()
        if isinstance(message, Publish):
            self._accept(message.key, message.value, deliver=True, source=remote)
        elif isinstance(message, Invalid):
            # The server forgot us (restarted, or we were silent too long).
            self.counters.invalid_received += 1
            self._hello(remote)
        elif isinstance(message, Pong):
            pass  # last_heard is all a PONG says
        else:
            self.counters.unexpected += 1

    def ping(self) -> None:
        """Tell every remote we are alive (or resynchronise one a send failed to)."""
        for remote in self._remotes.values():
            if remote.resync:
                self._hello(remote)
            elif not remote.send(_PING):
                self._failed_remote(remote)

    def _hello(self, remote: _Remote) -> None:
        remote.resync = False
        if not remote.send(_HELLO):
            self._failed_remote(remote)
            return
        for key, value in self.table.items():
            self.counters.forwarded += 1
            if not remote.send(encode(Publish(key, value))):
                self._failed_remote(remote)
                return

    def _failed_remote(self, remote: _Remote) -> None:
        self.counters.send_failed += 1
        remote.resync = True

    # Server side

    def from_client(self, frames: Sequence[bytes]) -> None:
        """One message from a client: its routing id, then the frame."""
        if self._send_to_client is None or not frames:
            return
        route = frames[0]
        message = self._decode(frames[1:], 1, route.hex())
        if message is None:
            return
        known = route in self._clients
        if isinstance(message, Hello):
            if not known and len(self._clients) >= self.max_clients:
                self.counters.clients_refused += 1
                return
            # CZMQ answers a second HELLO with INVALID; a fresh sync serves better.
            self._clients[route] = self._clock.seconds()
            self._sync_client(route)
        elif isinstance(message, Publish | Ping):
            if not known:
                self.counters.invalid_sent += 1
                self._send_to_client(route, _INVALID)
                return
            self._clients[route] = self._clock.seconds()
            if isinstance(message, Publish):
                self._accept(message.key, message.value, deliver=True)
            elif not self._send_to_client(route, _PONG):
                self._failed_client(route)
        else:
            # PONG and INVALID are a server's words; never answered (no loops).
            self.counters.unexpected += 1

    def forget_clients(self) -> None:
        """Forget every client (the server stopped)."""
        self._clients.clear()

    def expire(self) -> None:
        """Forget every client silent for C{client_timeout} or more."""
        deadline = self._clock.seconds() - self.client_timeout
        for route, heard in list(self._clients.items()):
            if heard <= deadline:
                del self._clients[route]
                self.counters.expired += 1

    def _sync_client(self, route: bytes) -> None:
        assert self._send_to_client is not None
        for key, value in self.table.items():
            self.counters.forwarded += 1
            if not self._send_to_client(route, encode(Publish(key, value))):
                self._failed_client(route)
                return

    def _failed_client(self, route: bytes) -> None:
        # Forgotten: its next PING gets INVALID, and its HELLO a full sync.
        self.counters.send_failed += 1
        self._clients.pop(route, None)

    # Both sides

    def _decode(self, frames: Sequence[bytes], expected: int, peer: str) -> GossipMessage | None:
        try:
            if len(frames) != expected:
                raise MalformedGossip(f"{len(frames)} frames, zgossip has one")
            message = decode(frames[0])
        except MalformedGossip as e:
            self.counters.malformed += 1
            self._logs.info("malformed", "Dropped a zgossip frame from {peer}: {e}", peer=peer, e=e)
            return None
        self.counters.received += 1
        return message

    def _accept(self, key: str, value: str, deliver: bool, source: _Remote | None = None) -> bool:
        """
        Store a tuple; if new or changed, deliver it and forward it to every
        client and every remote but the one it came from (which has it).
        CZMQ sends it back there too; with a server's echo, that makes a key
        changed twice in quick succession swing between its two values
        forever, where skipping the source lets it settle on the last.
        """
        refused = self.table.refused
        if not self.table.store(key, value):
            if self.table.refused != refused:
                self.counters.refused += 1
                self._logs.info(
                    "refused",
                    "Refused gossip tuple {key!r}: {reason}",
                    key=key[:64],
                    reason=self.table.refusal(key, value),
                )
            else:
                self.counters.duplicates += 1
            return False
        if deliver:
            self.counters.delivered += 1
            try:
                self._on_tuple(key, value)
            except Exception:
                # The application's bug must not cost the rest of the batch.
                _log.failure("on_tuple failed for gossip tuple {key!r}", key=key)
        self._forward(encode(Publish(key, value)), source)
        return True

    def _forward(self, frame: bytes, source: _Remote | None) -> None:
        if self._send_to_client is not None:
            for route in list(self._clients):
                self.counters.forwarded += 1
                if not self._send_to_client(route, frame):
                    self._failed_client(route)
        for remote in self._remotes.values():
            if remote is source:
                continue
            self.counters.forwarded += 1
            if not remote.send(frame):
                self._failed_remote(remote)


# Socket glue


def _queue_size(table: GossipTable) -> int:
    # Room for a whole table (a HELLO's answer) plus forwards in flight.
    return table.max_tuples + 1000


class Gossip:
    """
    The gossip node of one process: a server on C{bind} (if any) and a
    client of each server on C{connect}, sharing one table, in the reactor.

    @ivar bound: the endpoints the server really bound (a C{*} port
        replaced by the real one), once started.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        on_tuple: Callable[[str, str], None],
        bind: Sequence[str] = (),
        connect: Sequence[str] = (),
        ping_interval: float = 0.5,
        client_timeout: float = 30.0,
        clock: IReactorTime | None = None,
        table: GossipTable | None = None,
        curve: LinkCurve | None = None,
        zap_domain: bytes = PACK_DOMAIN,
    ) -> None:
        """
        @param on_tuple: called with each new or changed tuple that came
            from the network (not with this node's own L{publish}).
        @param clock: time and timers; the reactor by default.
        @param table: bounds other than the default L{GossipTable}'s.
        @param curve: this node's key pair and the keys its server admits
            (through ZAP, on C{zap_domain}); the remotes are then
            C{ENDPOINT|PUBLIC_KEY}.
        """
        self._reactor = reactor
        self._context = context
        self._bind = list(bind)
        self._connect = list(connect)
        self._curve = curve
        self._zap_domain = zap_domain
        self.strangers = 0  # messages dropped from a client whose key is no longer listed
        self.ping_interval = ping_interval
        self.client_timeout = client_timeout
        self._clock: IReactorTime = reactor if clock is None else clock  # type: ignore[assignment]
        self.core = GossipCore(
            self._clock,
            on_tuple,
            self._send_to_client if bind else None,
            client_timeout,
            table,
        )
        self.bound: list[str] = []
        self._server: ZmqSocket | None = None
        self._remotes: dict[str, ZmqSocket] = {}
        self._pinger = LoopingCall(self.core.ping)
        self._pinger.clock = self._clock
        self._expirer = LoopingCall(self.core.expire)
        self._expirer.clock = self._clock
        self._started = False

    @property
    def counters(self) -> GossipCounters:
        return self.core.counters

    @property
    def table(self) -> GossipTable:
        return self.core.table

    def start(self) -> None:
        """Bind the server, connect to each remote, start the timers."""
        if self._started:
            raise RuntimeError("gossip node already started")
        self._started = True
        try:
            if self._bind:
                self._start_server()
            for endpoint in self._connect:
                self.connect(endpoint)
        except BaseException:
            self.stop()
            raise
        self._start_pinging()

    def _start_pinging(self) -> None:
        if self._started and self._remotes and not self._pinger.running:
            self._pinger.start(self.ping_interval, now=False)

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        raw = self._context.socket(kind)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.SNDHWM, _queue_size(self.core.table))
        raw.setsockopt(zmq.RCVHWM, _queue_size(self.core.table))
        raw.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        return raw

    def _start_server(self) -> None:
        raw = self._socket(zmq.ROUTER)
        # A send to a client gone or not draining fails at once, so it is forgotten.
        raw.setsockopt(zmq.ROUTER_MANDATORY, 1)
        curve = self._curve
        if curve is not None:
            raw.setsockopt(zmq.CURVE_SERVER, 1)
            raw.setsockopt(zmq.CURVE_SECRETKEY, curve.keys.secret)
            raw.setsockopt(zmq.ZAP_DOMAIN, self._zap_domain)
            # Without a ZAP handler, refuse everyone rather than admit anyone.
            raw.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        try:
            for endpoint in self._bind:
                raw.bind(endpoint)
                self.bound.append(raw.getsockopt_string(zmq.LAST_ENDPOINT))
        except zmq.ZMQError:
            raw.close(linger=0)
            raise
        self._server = ZmqSocket(
            self._reactor, raw, self._from_clients, identified=curve is not None
        )
        self._server.startReading()
        # Forgotten between client_timeout and 1.25 times it.
        self._expirer.start(self.client_timeout / 4, now=False)

    def connect(self, endpoint: str) -> None:
        """
        Become a client of the server at C{endpoint} (also after L{start});
        C{ENDPOINT|PUBLIC_KEY} with CURVE.

        @raise ValueError: a server without its key with CURVE, or with one
            without CURVE, or a key that is not one.
        """
        if endpoint in self._remotes:
            raise ValueError(f"already a client of {endpoint}")
        address, _, key = endpoint.partition("|")
        if (self._curve is None) != (not key):
            raise ValueError(
                f"gossip server {endpoint!r}: ENDPOINT|PUBLIC_KEY with CURVE, ENDPOINT without"
            )
        raw = self._socket(zmq.DEALER)
        try:
            if self._curve is not None:
                raw.setsockopt(zmq.CURVE_SERVERKEY, key.encode("ascii"))
                raw.setsockopt(zmq.CURVE_PUBLICKEY, self._curve.keys.public)
                raw.setsockopt(zmq.CURVE_SECRETKEY, self._curve.keys.secret)
            raw.connect(address)
        except (zmq.ZMQError, UnicodeError) as e:
            raw.close(linger=0)
            if isinstance(e, zmq.ZMQError) and e.errno != errno.EINVAL:
                raise
            raise ValueError(f"gossip server {endpoint!r}: {e}") from e
        sock = ZmqSocket(self._reactor, raw, lambda batch: self._from_remote(endpoint, batch))
        self._remotes[endpoint] = sock
        sock.startReading()
        self.core.add_remote(endpoint, lambda frame: sock.send_to(frame, ()))
        self._start_pinging()

    def publish(self, key: str, value: str) -> bool:
        """
        A tuple of this node, sent to every client and remote.

        @return: True if new or changed; False for a duplicate or a tuple
            the table's bounds refuse (counted).
        """
        return self.core.publish(key, value)

    def stop(self) -> None:
        """Close every socket (linger 0) and cancel the timers."""
        for loop in (self._pinger, self._expirer):
            if loop.running:
                loop.stop()
        if self._server is not None:
            self._server.close(linger=0)
            self._server = None
            self.core.forget_clients()
        for endpoint, sock in self._remotes.items():
            self.core.remove_remote(endpoint)
            sock.close(linger=0)
        self._remotes.clear()

    def _send_to_client(self, route: bytes, frame: bytes) -> bool:
        if self._server is None:
            return False
        return self._server.send_to(route, (frame,))

    def _from_clients(self, batch: Batch) -> None:
        receive = self.core.from_client
        curve = self._curve
        for frames in batch:
            if curve is not None:
                # The key ZAP admitted this client's connection with.
                key, frames = frames[0], frames[1:]
                if not curve.allowed.admits(key):
                    self.strangers += 1
                    continue
            try:
                receive(frames)
            except Exception:
                # A bug met by one message must not cost the rest of the
                # batch, nor the socket (the reactor drops a reader that raises).
                _log.failure("handling a gossip message from a client failed")

    def _from_remote(self, endpoint: str, batch: Batch) -> None:
        receive = self.core.from_remote
        for frames in batch:
            try:
                receive(endpoint, frames)
            except Exception:
                _log.failure("handling a gossip message from {endpoint} failed", endpoint=endpoint)
