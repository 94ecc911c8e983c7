"""
The broker model: connections, streams, mailboxes, services and credit.
Pure state: no socket, no frame layout, no file, no thread; time comes
from an injected clock.

What each module holds:

- C{session}: how the model meets the parties connected to it: the
  L{Session} interface it answers and delivers through (the session's
  dialect decides encoding and policy, L{Hold}), and the L{Receiver}
  interface transports feed.
- C{broker}: L{Broker}, the receiver: runs the state table's actions for
  each message from a session.
- C{machine}: the per-session state table (state, event -> actions, next
  state), in the manner of the C broker's ``mlm_server.xml``.
- C{registry}: who is connected: connections by session and by address.
- C{connection}: what the model keeps for one open session.
- C{streams} (every stream, writing and delivery, live and from the
  journal) and C{stream} (one stream and its readers).
- C{post_office} (mailboxes and service queues: store, receipt, deliver,
  hold, requeue, expire), C{service} (one service and its workers),
  C{letters} (letters and their bounded queues), C{deadlines}, C{receipts}
  (what a letter's sender is owed, in send order).
- C{store}: the L{Store} interface and its records, which the journal
  implements; C{limits}: every bound; C{errors}: L{Refused}.
- C{access}: who may do what (the access-control file, address
  ownership); C{stalled}: connections that do not drain, retried;
  C{log_limit}: lines per second per kind of event clients can cause.

How a message flows: a transport decodes frames and calls
C{Broker.receive(session, message)}; the broker finds the session's
connection in the registry (none: START), runs the row of the state table
for (state, message type), whose actions call into the streams or the post
office, and applies the row's next state. Answers and deliveries go back by
calling sessions (C{ok}, C{deliver_stream}, C{deliver_letter}, C{stored},
...); a stream fan-out hands every reader the same record, so each dialect
encodes it once. Writes to the store return at once; its callbacks (a
letter is durable, a journal read is done) come back later on the same
reactor thread.

Tests: ``tests/unit/test_broker_model.py`` (behaviour, through MLM sessions),
``tests/unit/test_broker_sessions.py`` (in-memory sessions), and one module per
part (``tests/unit/test_broker_machine.py``, ``tests/unit/test_broker_registry.py``...).
"""
