"""
Transports: how parties reach the broker model. Only this package knows
sockets.

- C{zmqsocket}: a ZeroMQ socket in the Twisted reactor (edge-triggered FD
  drained in batches, no I/O threads).
- C{router}: a ROUTER socket of the broker as a service, bound on the
  configured endpoints of one security mechanism (one router per
  mechanism); an authenticated one reads each message's user.
- C{sessions}: the socket-free half of the ROUTER: one L{MlmSession} per
  routing id, decoding, size limits, feeding the broker.
- C{dialects}: MLM versions 1 and 2: how a session encodes what the model
  says, and the policy that goes with each.
- C{zap}: PLAIN and CURVE authentication (a ZAP handler, the password
  file, refusals answered late per (address, user): the login throttle).
- C{handshakes}: failed security handshakes on the ROUTERs, logged.
- C{curve}: CURVE certificates: the broker's secret key, the allowed
  clients' keys with their users, and a command that makes key pairs.
- C{security}: the security files (passwords, CURVE clients, access
  rules) loaded into the ZAP handler and the broker, reloaded on SIGHUP.
- C{gate}: the read gate: the journal's backlog pauses reading.

Frames come off the socket in a batch, go to C{MlmSessions.receive} (route,
frames and, on an authenticated socket, the connection's user), are
decoded by L{malamute_pack.protocol.mlm} and handed to the broker with
their session; the broker answers through the session, whose dialect
encodes and whose output is the same socket.

Tests: ``tests/unit/test_transport_zmqsocket.py``, ``tests/unit/test_transport_sessions.py``,
``tests/unit/test_transport_zap.py``, ``tests/unit/test_transport_curve.py``,
``tests/unit/test_transport_security.py``,
``tests/unit/test_transport_gate.py``, ``tests/unit/test_end_to_end.py``.
"""
