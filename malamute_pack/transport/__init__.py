"""
Transports: how parties reach the broker model. Only this package knows
sockets.

- C{zmqsocket}: a ZeroMQ socket in the Twisted reactor (edge-triggered FD
  drained in batches, no I/O threads).
- C{router}: the broker's ROUTER socket as a service, bound on every
  configured endpoint.
- C{sessions}: the socket-free half of the ROUTER: one L{MlmSession} per
  routing id, decoding, size limits, feeding the broker.
- C{dialects}: MLM versions 1 and 2: how a session encodes what the model
  says, and the policy that goes with each.
- C{zap}: PLAIN authentication (a ZAP handler and the password file).

Frames come off the socket in a batch, go to C{MlmSessions.receive} (route,
frames), are decoded by L{malamute_pack.protocol.mlm} and handed to the
broker with their session; the broker answers through the session, whose
dialect encodes and whose output is the same socket.

Tests: ``tests/test_transport_zmqsocket.py``, ``tests/test_transport_sessions.py``,
``tests/test_transport_zap.py``, ``tests/test_end_to_end.py``.
"""
