"""
The broker model: connections, streams, mailboxes, services and credit.
Pure state: no socket, no frame layout, no file, no thread; time comes
from an injected clock.

What each module holds:

- C{session}: the L{Session} interface the model answers and delivers
  through (L{Hold}: what a delivery leaves held), L{PartySession} and the
  L{Receiver} interface transports feed.
- C{broker}: L{Broker}, the receiver: runs the state table's actions for
  each message from a session.
- C{machine}: the per-session state table (state, event -> actions, next
  state), in the manner of the C broker's ``mlm_server.xml``.
- C{registry}: who is connected: connections by session and by address.
- C{connection}: what the model keeps for one open session.
- C{streams}: every stream: writing, live delivery, delivery from the journal.
- C{stream}: one stream, its readers indexed by pattern, its counters.
- C{appends}: the keys of idempotent appends, written and being written.
- C{consumers}: durable named readers: positions kept in the journal,
  commits, takeover, forgetting (STREAM_CONSUME, STREAM_COMMIT).
- C{groups}: consumer groups: a stream's records shared among members,
  in order per subject, given back when a member leaves.
- C{ranges}: bulk reads of retained records (STREAM_QUERY, STREAM_READ_RANGE).
- C{post_office}: mailboxes and service queues: store, receipt, deliver,
  hold, requeue, expire.
- C{service}: one service: its queue and its workers indexed by pattern.
- C{letters}: letters and their bounded queues.
- C{deadlines}: letters' deadlines and service requests' leases.
- C{receipts}: what a letter's sender is owed, in send order.
- C{interests}: what local readers, addresses and workers want, for the pack.
- C{access}: who may do what (the access-control file, address ownership).
- C{stalled}: connections that do not drain, retried.
- C{log_limit}: log lines per second per kind of event clients can cause.
- C{limits}: every bound, configurable.
- C{errors}: L{Refused}, what an action raises when it cannot act.

The model stores through L{malamute_pack.store.Store}, which the journal
implements.

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
