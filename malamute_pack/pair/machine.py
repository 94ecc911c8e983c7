"""
The pair's Binary Star state machine: which of two brokers (a primary and a
backup, fixed by configuration) serves clients, after the zguide's chapter 4
(``bstar.c``), as an explicit table checked at import.

The machine holds no socket and no timer: the service feeds it the
partner's heartbeats (L{PairMachine.heard}, then L{PairMachine.handle} with
the heartbeat's state), client requests, and PEER_SILENT when the partner's
expiry passes, always with the time (C{now}, seconds), and runs the actions
of the L{Transition} it gets back.

A broker is STARTING until it hears its partner (the zguide's STATE_PRIMARY
and STATE_BACKUP: STARTING plus the role), then ACTIVE (serves clients) or
PASSIVE (refuses them, and takes over when a client turns to it after the
partner fell silent). The partner counts as gone C{heartbeat * misses}
seconds after its last heartbeat (defaults: a heartbeat every 0.5 s, gone
after 3 missed, so after 1.5 s of silence); before the first heartbeat, that
long after the machine was made, so a primary that starts alone waits that
long before a client can make it active.

Silence is counted in the time this process ran: the service tells the
machine the time of everything it sees (L{PairMachine.observe}: its own
heartbeat tick, a heartbeat, a client), before the event itself, and a gap
between two longer than two heartbeats is a stall of this process
(SIGSTOP, a swap storm, a reactor held up), in which it could hear
nothing: it does not count as the partner's silence. A broker that was
paused does not take its partner for gone when it resumes, before it has
had the time to hear it.

Taking over, and going on alone, never meet: a passive takes over only if
it is in sync (L{Guard.SAFE_TAKEOVER}), and an active goes on alone (its
acknowledgements stop waiting for the partner) only on evidence that the
partner's process is gone (the service's: it restarted, or its port
refuses connections), never on silence alone: a process that is gone comes
back out of sync, so it cannot take over what was acknowledged without it.
(Silence cannot tell a dead partner from a cut link, and a cut partner
may be taking over.) An operator who prefers the writers never to wait
for a dead host's partner sets C{alone_after}: the active then goes on
alone after that much silence too (L{alone}), and a passive takes over
only if it heard the active less than C{alone_after} less a heartbeat ago
(wall time, pauses included), which closes all but one window: a split
of the clients themselves, each half served by one broker. A passive that
finds the active silent but may lack what it acknowledged refuses the
clients (the pair waits for the old active, whose journal is complete).

Where this differs from ``bstar.c``:
 - dual actives and dual passives do not abort: the history decides, then
   the role (of two actives, the one that took over from the other's
   history serves and the other yields; unrelated, the backup yields; the
   primary leaves a PASSIVE);
 - of two starting brokers, the one whose journal took over from the
   other's history serves (the heartbeat carries the history a journal
   took over from, unless it lost records to damage), then the one whose
   journal led last, then the primary;
 - a PASSIVE broker whose partner restarted goes ACTIVE only when it is in
   sync (it holds every acknowledged change); otherwise it stays PASSIVE and
   the restarted partner, hearing a PASSIVE, goes ACTIVE;
 - STARTING + PEER_PASSIVE goes ACTIVE (the partner is waiting for one);
 - two brokers with the same role report the configuration error.

Partner silence is reported once: PEER_SILENT gives REPORT_PARTNER_GONE the
first time the partner is silent, nothing after that, and the next peer
event after such a report carries REPORT_PARTNER_BACK before its row's
actions; so GONE and BACK strictly alternate.

Tests: ``tests/unit/test_pair_machine.py``.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

# The defaults: a heartbeat every half second, the partner gone after three
# missed (1.5 s): a fail-over well under two seconds, while a partner that
# stalls for a second (a slow disk, a busy reactor) is not taken for dead.
DEFAULT_HEARTBEAT: Final = 0.5
DEFAULT_MISSES: Final = 3


class Role(enum.Enum):
    """A broker's place in the pair, fixed by configuration."""

    PRIMARY = "primary"
    BACKUP = "backup"


class State(enum.Enum):
    """Where a broker is in the pair."""

    STARTING = "starting"  # has not yet settled with its partner
    ACTIVE = "active"  # serves clients
    PASSIVE = "passive"  # refuses clients while the partner serves them


class Event(enum.Enum):
    """What the machine is fed."""

    PEER_STARTING = "peer_starting"  # the partner's heartbeat: it is STARTING (with its role)
    PEER_ACTIVE = "peer_active"  # the partner's heartbeat: it is ACTIVE
    PEER_PASSIVE = "peer_passive"  # the partner's heartbeat: it is PASSIVE
    CLIENT_REQUEST = "client_request"  # a client connected or sent a command
    PEER_SILENT = "peer_silent"  # the service saw the partner's expiry pass


# The events that are the partner's heartbeats.
PEER_EVENTS: Final = frozenset({Event.PEER_STARTING, Event.PEER_ACTIVE, Event.PEER_PASSIVE})


class Action(enum.Enum):
    """What the service does for a transition, in the order given."""

    BECOME_ACTIVE = "become_active"  # every transition into ACTIVE
    TAKE_OVER = "take_over"  # also, into ACTIVE from PASSIVE: the partner's role is taken
    BECOME_PASSIVE = "become_passive"  # every transition into PASSIVE
    ACCEPT_CLIENT = "accept_client"
    REFUSE_CLIENT = "refuse_client"
    REPORT_DUAL_ACTIVE = "report_dual_active"  # both were ACTIVE: logged loudly
    REPORT_SAME_ROLE = "report_same_role"  # both brokers have one role: a configuration error
    REPORT_PARTNER_GONE = "report_partner_gone"
    REPORT_PARTNER_BACK = "report_partner_back"
    # The active is silent, but this passive may lack what it acknowledged
    # alone (not in sync, or silent for too long): it does not take over.
    REPORT_NO_TAKEOVER = "report_no_takeover"


class Guard(enum.Enum):
    """The condition under which a row applies; a state's rows for an event are tried in order."""

    ALWAYS = "always"  # the only row
    SAME_ROLE = "same role"  # the partner's heartbeat names this broker's own role
    PRIMARY = "primary"  # this broker is the primary
    # A primary that may serve alone (its journal holds no history yet, or
    # the operator's alone-after has passed: the service's leads), its
    # partner silent.
    PRIMARY_LEADS_PARTNER_SILENT = "primary that may serve alone, partner silent"
    PARTNER_SILENT = "partner silent"  # now >= peer_expiry
    # The partner is silent, this broker is in sync (and, with alone-after
    # set, it heard the partner less than alone-after less a heartbeat ago).
    SAFE_TAKEOVER = "partner silent, in sync"
    # Between two actives: the partner took over from the history this
    # broker leads (it is the newer active), or this one from the partner's.
    PARTNER_NEWER = "the partner took over from this one"
    PARTNER_OLDER = "this one took over from the partner"
    IN_SYNC = "in sync"  # this broker holds every acknowledged change
    # Whose journal leads the history the pair last served (it was the
    # last active): carried by the partner's heartbeat.
    LEADS = "this journal leads"
    PARTNER_LEADS = "the partner's journal leads"
    NEWLY_SILENT = "partner silent, not yet reported"
    OTHERWISE = "otherwise"  # the last of several rows


class Row(NamedTuple):
    """One row: if C{guard} holds, run C{actions} and go to C{next}."""

    guard: Guard
    actions: tuple[Action, ...]
    next: State


@dataclass(frozen=True)
class Transition:
    """What L{PairMachine.handle} did: the state it is now in, and the actions to run."""

    state: State
    actions: tuple[Action, ...]


_S = State
_E = Event
_A = Action
_G = Guard
_CLIENT_ENDS = (_A.ACCEPT_CLIENT, _A.REFUSE_CLIENT)

TABLE: Final[Mapping[tuple[State, Event], tuple[Row, ...]]] = {
    # STARTING: waiting to hear the partner (or for a client after its silence).
    (_S.STARTING, _E.PEER_STARTING): (
        # Two primaries (or two backups): neither may go active; say so.
        Row(_G.SAME_ROLE, (_A.REPORT_SAME_ROLE,), _S.STARTING),
        # Both starting: the history decides first. A journal that took over
        # from the other's history is the newer, whether it still leads or
        # not (a broker that stopped serving while its partner was silent
        # leads no more, yet holds what it acknowledged alone before): it
        # serves, whatever its role...
        Row(_G.PARTNER_NEWER, (), _S.STARTING),
        Row(_G.PARTNER_OLDER, (_A.BECOME_ACTIVE,), _S.ACTIVE),
        # ...else the one that was active last serves, whatever its role
        # (the other's journal lacks what it acknowledged alone)...
        Row(_G.PARTNER_LEADS, (), _S.STARTING),
        Row(_G.LEADS, (_A.BECOME_ACTIVE,), _S.ACTIVE),
        # ...else the primary goes active; the backup hears that and goes passive.
        Row(_G.PRIMARY, (_A.BECOME_ACTIVE,), _S.ACTIVE),
        # The backup waits for the primary to go active.
        Row(_G.OTHERWISE, (), _S.STARTING),
    ),
    (_S.STARTING, _E.PEER_ACTIVE): (
        # The partner serves the history this journal took over from (it
        # refused its clients, cut off, while this one served them, then
        # this one died): this journal is the newer; the partner hears it
        # starting and yields, and both settle as starting brokers do (found
        # by the soak: this one went passive, was cut back to the older
        # history, and what it acknowledged alone was lost)...
        Row(_G.PARTNER_OLDER, (), _S.STARTING),
        # ...else the partner serves: this one backs it up, whatever its role.
        Row(_G.OTHERWISE, (_A.BECOME_PASSIVE,), _S.PASSIVE),
    ),
    # The partner waits for an active one (it stayed passive while this one
    # restarted, not in sync to serve): serve.
    (_S.STARTING, _E.PEER_PASSIVE): (Row(_G.ALWAYS, (_A.BECOME_ACTIVE,), _S.ACTIVE),),
    (_S.STARTING, _E.CLIENT_REQUEST): (
        # A primary that heard nobody for the whole timeout serves alone only
        # if it may (a new pair's, or alone-after passed): any other may
        # lack what the backup acknowledged after taking over meanwhile.
        Row(_G.PRIMARY_LEADS_PARTNER_SILENT, (_A.BECOME_ACTIVE, _A.ACCEPT_CLIENT), _S.ACTIVE),
        # A primary with a live partner may be failing back while the backup
        # serves; a backup never starts active by itself (silent partner or not).
        Row(_G.OTHERWISE, (_A.REFUSE_CLIENT,), _S.STARTING),
    ),
    # ACTIVE: serving.
    (_S.ACTIVE, _E.PEER_STARTING): (
        # The partner restarted, and its journal took over from the history
        # this one serves (while this one refused its clients, cut off from
        # it, the partner served them, then died): it is the newer; this
        # one yields, and both settle as starting brokers do...
        Row(_G.PARTNER_NEWER, (_A.BECOME_PASSIVE,), _S.PASSIVE),
        # ...else it will hear ACTIVE and go passive.
        Row(_G.OTHERWISE, (), _S.ACTIVE),
    ),
    (_S.ACTIVE, _E.PEER_ACTIVE): (
        # Dual actives (this one paused or cut off while the clients made
        # the other take over, or a race at start): the newer active, the
        # one that took over from the other's history, keeps serving...
        Row(_G.PARTNER_NEWER, (_A.REPORT_DUAL_ACTIVE, _A.BECOME_PASSIVE), _S.PASSIVE),
        Row(_G.PARTNER_OLDER, (_A.REPORT_DUAL_ACTIVE,), _S.ACTIVE),
        # ...and between unrelated histories the primary keeps serving...
        Row(_G.PRIMARY, (_A.REPORT_DUAL_ACTIVE,), _S.ACTIVE),
        # ...and the backup yields.
        Row(_G.OTHERWISE, (_A.REPORT_DUAL_ACTIVE, _A.BECOME_PASSIVE), _S.PASSIVE),
    ),
    # The normal heartbeat of a pair at work.
    (_S.ACTIVE, _E.PEER_PASSIVE): (Row(_G.ALWAYS, (), _S.ACTIVE),),
    (_S.ACTIVE, _E.CLIENT_REQUEST): (Row(_G.ALWAYS, (_A.ACCEPT_CLIENT,), _S.ACTIVE),),
    # PASSIVE: backing up the partner.
    (_S.PASSIVE, _E.PEER_STARTING): (
        # The active partner restarted: serve, if this journal is the complete one;
        # the restarted partner hears ACTIVE and goes passive.
        Row(_G.IN_SYNC, (_A.BECOME_ACTIVE, _A.TAKE_OVER), _S.ACTIVE),
        # Otherwise stay: the restarted partner hears PASSIVE and goes active.
        Row(_G.OTHERWISE, (), _S.PASSIVE),
    ),
    # The normal heartbeat of a pair at work.
    (_S.PASSIVE, _E.PEER_ACTIVE): (Row(_G.ALWAYS, (), _S.PASSIVE),),
    (_S.PASSIVE, _E.PEER_PASSIVE): (
        # Dual passives would serve nobody: the primary goes active...
        Row(_G.PRIMARY, (_A.BECOME_ACTIVE, _A.TAKE_OVER), _S.ACTIVE),
        # ...and the backup stays.
        Row(_G.OTHERWISE, (), _S.PASSIVE),
    ),
    (_S.PASSIVE, _E.CLIENT_REQUEST): (
        # Failover: the active is silent, a client turned to this one, and
        # this one holds everything the active can have acknowledged.
        Row(_G.SAFE_TAKEOVER, (_A.BECOME_ACTIVE, _A.TAKE_OVER, _A.ACCEPT_CLIENT), _S.ACTIVE),
        # Silent, but the active may have acknowledged alone what this one
        # lacks: wait for it (its journal is the complete one).
        Row(_G.PARTNER_SILENT, (_A.REPORT_NO_TAKEOVER, _A.REFUSE_CLIENT), _S.PASSIVE),
        # The active is alive: the client has to go to it.
        Row(_G.OTHERWISE, (_A.REFUSE_CLIENT,), _S.PASSIVE),
    ),
    # Any state: the partner's silence is reported (once) and changes nothing;
    # only a client request makes a passive broker take over.
    **{
        (state, _E.PEER_SILENT): (
            Row(_G.NEWLY_SILENT, (_A.REPORT_PARTNER_GONE,), state),
            Row(_G.OTHERWISE, (), state),
        )
        for state in State
    },
}


def table_problems(table: Mapping[tuple[State, Event], tuple[Row, ...]]) -> list[str]:
    """
    What is wrong with C{table}, if anything: a missing pair of state and
    event, rows that leave a case undecided or can never apply, a client
    request neither accepted nor refused, a transition without its actions.
    """
    problems = []
    for state, event in itertools.product(State, Event):
        rows = table.get((state, event), ())
        where = f"{state.value} + {event.value}"
        if not rows:
            problems.append(f"{where}: no row")
            continue
        last = (_G.ALWAYS,) if len(rows) == 1 else (_G.OTHERWISE,)
        if rows[-1].guard not in last:
            problems.append(f"{where}: the last row's guard must be {last[0].value}")
        if any(row.guard in (_G.ALWAYS, _G.OTHERWISE) for row in rows[:-1]):
            problems.append(f"{where}: a row after an unconditional one never applies")
        for row in rows:
            rowWhere = f"{where} [{row.guard.value}]"
            problems.extend(f"{rowWhere}: {p}" for p in _row_problems(state, event, row))
    return problems


def _row_problems(state: State, event: Event, row: Row) -> list[str]:
    """What is wrong with C{row} of C{state} + C{event}, if anything."""
    problems = []
    actions = row.actions
    if len(set(actions)) != len(actions):
        problems.append("an action twice")
    ends = [action for action in actions if action in _CLIENT_ENDS]
    if event is _E.CLIENT_REQUEST and (len(ends) != 1 or actions[-1] not in _CLIENT_ENDS):
        problems.append("a client request must end in exactly one of accept or refuse")
    if event is not _E.CLIENT_REQUEST and ends:
        problems.append("only a client request is accepted or refused")
    into_active = row.next is _S.ACTIVE and state is not _S.ACTIVE
    if into_active != (_A.BECOME_ACTIVE in actions):
        problems.append("become_active must come with, and only with, a move into active")
    if (into_active and state is _S.PASSIVE) != (_A.TAKE_OVER in actions):
        problems.append("take_over must come with, and only with, a move from passive to active")
    into_passive = row.next is _S.PASSIVE and state is not _S.PASSIVE
    if into_passive != (_A.BECOME_PASSIVE in actions):
        problems.append("become_passive must come with, and only with, a move into passive")
    if event is _E.PEER_SILENT and row.next is not state:
        problems.append("the partner's silence changes no state")
    if (_A.REPORT_PARTNER_GONE in actions) and event is not _E.PEER_SILENT:
        problems.append("only the partner's silence reports it gone")
    if _A.REPORT_PARTNER_BACK in actions:
        problems.append("report_partner_back is added by the machine, not by a row")
    if row.guard is _G.SAME_ROLE and event is not _E.PEER_STARTING:
        problems.append("only the partner's starting heartbeat carries its role")
    if row.guard in (_G.LEADS, _G.PARTNER_LEADS) and event is not _E.PEER_STARTING:
        problems.append("leadership decides only between two starting brokers")
    if row.guard is _G.NEWLY_SILENT and event is not _E.PEER_SILENT:
        problems.append("newly silent is a guard of the partner's silence only")
    if row.guard in (_G.PARTNER_NEWER, _G.PARTNER_OLDER) and event not in (
        _E.PEER_ACTIVE,
        _E.PEER_STARTING,
    ):
        problems.append("which history is newer decides only between two actives or starting")
    if (row.guard is _G.SAFE_TAKEOVER) != (_A.TAKE_OVER in actions and event is _E.CLIENT_REQUEST):
        problems.append("a client makes a passive take over exactly when it safely may")
    return problems


def check_table(table: Mapping[tuple[State, Event], tuple[Row, ...]]) -> None:
    """Raise C{ValueError} naming every problem of C{table}, if it has any."""
    problems = table_problems(table)
    if problems:
        raise ValueError("pair state table: " + "; ".join(problems))


check_table(TABLE)


def render_table(table: Mapping[tuple[State, Event], tuple[Row, ...]] = TABLE) -> list[str]:
    """
    C{table} as text, a line a row in the order rows are tried:
    C{state + event [guard] -> actions -> next} (no guard for a row that
    always applies, C{-} for no actions), then the rule for
    REPORT_PARTNER_BACK, which no row carries.
    """
    lines = []
    for state, event in itertools.product(State, Event):
        for row in table[(state, event)]:
            guard = "" if row.guard is _G.ALWAYS else f" [{row.guard.value}]"
            actions = ", ".join(action.value for action in row.actions) or "-"
            lines.append(f"{state.value} + {event.value}{guard} -> {actions} -> {row.next.value}")
    lines.append(
        "any + peer_starting/peer_active/peer_passive [partner reported gone]"
        " -> report_partner_back, then the row's actions -> the row's next"
    )
    return lines


class PairMachine:
    """
    One broker's side of the pair: its role, state and partner's expiry.

    @ivar role: this broker's role, fixed by configuration.
    @ivar state: where it is now (STARTING at first).
    @ivar peer_expiry: the time from which the partner counts as gone
        (moved on by this process's own stalls).
    @ivar timeout: how long the partner may be silent (heartbeat * misses, seconds).
    @ivar alone_after: seconds of the partner's silence (this process
        running) after which an active goes on alone; None: never on
        silence alone (only on evidence the partner's process is gone).
    @ivar stalls: how many stalls of this process it saw (and did not count
        as the partner's silence).
    """

    def __init__(
        self,
        role: Role,
        now: float,
        heartbeat: float = DEFAULT_HEARTBEAT,
        misses: int = DEFAULT_MISSES,
        alone_after: float | None = None,
    ) -> None:
        """
        A broker of C{role}, starting at C{now}, whose partner heartbeats every
        C{heartbeat} seconds and is gone after C{misses} missed ones; an
        active goes on alone after C{alone_after} seconds of silence, if
        given (None: never on silence alone).

        @raise ValueError: if C{heartbeat} is not positive, C{misses} is
            below 1, or C{alone_after} is not past the timeout by two heartbeats.
        """
        if not heartbeat > 0:
            raise ValueError(f"the heartbeat interval must be positive, not {heartbeat!r}")
        if misses < 1:
            raise ValueError(f"the partner must be allowed at least one miss, not {misses!r}")
        self.role = role
        self.state = State.STARTING
        self.timeout = heartbeat * misses
        least = self.timeout + 2 * heartbeat
        if alone_after is not None and alone_after < least:
            raise ValueError(
                f"alone-after must be at least the partner's timeout and two heartbeats"
                f" ({least:g} s), not {alone_after!r}"
            )
        self.alone_after = alone_after
        self._heartbeat = heartbeat
        self.peer_expiry = now + self.timeout
        self._alone_at = now + (alone_after if alone_after is not None else 0.0)
        # When the partner was last heard (wall time: pauses included), if ever.
        self._heard_at: float | None = None
        # The last time this machine saw anything: a longer gap is a stall.
        self._seen = now
        self.stalls = 0
        # REPORT_PARTNER_GONE given and REPORT_PARTNER_BACK not yet.
        self._reportedGone = False

    def observe(self, now: float) -> None:
        """
        Time passes at C{now}: a gap since the last thing seen longer than
        two heartbeats was a stall of this process (it could hear nothing),
        and moves the partner's expiry and the time to go alone on by it
        (less the heartbeat that would have passed anyway).
        """
        gap = now - self._seen
        if gap > 2 * self._heartbeat:
            stall = gap - self._heartbeat
            self.peer_expiry += stall
            self._alone_at += stall
            self.stalls += 1
        if now > self._seen:
            self._seen = now

    def heard(self, now: float) -> None:
        """A heartbeat from the partner arrived at C{now} (in any state)."""
        self.peer_expiry = now + self.timeout
        self._alone_at = now + (self.alone_after or 0.0)
        self._heard_at = now

    def partner_alive(self, now: float) -> bool:
        """Whether the partner was heard within the timeout before C{now} (stalls aside)."""
        return now < self.peer_expiry

    def alone(self, now: float) -> bool:
        """
        Whether the partner has been silent for C{alone_after} (stalls
        aside), if set: an active goes on alone, its acknowledgements no
        longer waiting for the partner.
        """
        return self.alone_after is not None and now >= self._alone_at

    def safe_takeover(self, now: float, in_sync: bool) -> bool:
        """
        Whether a passive may take over at C{now}: the partner is silent
        and this broker is C{in_sync}; with C{alone_after} set, also it
        heard the partner less than C{alone_after} less a heartbeat ago in
        wall time (a pause of this process counts: the active may have gone
        alone meanwhile).
        """
        if self.partner_alive(now) or not in_sync:
            return False
        heard_at, alone_after = self._heard_at, self.alone_after
        return alone_after is None or (
            heard_at is not None and now - heard_at < alone_after - self._heartbeat
        )

    def handle(
        self,
        event: Event,
        now: float,
        *,
        peer_role: Role | None = None,
        in_sync: bool = False,
        leads: bool = False,
        peer_leads: bool = False,
        partner_newer: bool = False,
        partner_older: bool = False,
    ) -> Transition:
        """
        Apply C{event}, which happened at C{now}: find the first row of the
        current state for it whose guard holds, move to its next state and
        return it with the actions to run. For a peer event, call L{heard}
        first.

        @param peer_role: the partner's role, which its PEER_STARTING
            heartbeat carries (required with it, ignored otherwise).
        @param in_sync: whether this broker holds every acknowledged change
            (the guard of a passive broker whose partner restarted).
        @param leads: whether this broker's journal leads the history the
            pair last served (this broker was the last active);
            C{peer_leads}, the same of the partner's (its heartbeat says).
            Between two starting brokers the one that leads, alone, serves.
            With CLIENT_REQUEST it says whether a primary that heard nobody
            may serve alone (L{Guard.PRIMARY_LEADS_PARTNER_SILENT}).
        @param partner_newer: (between two actives, or two starting
            brokers) the partner took over from the history this broker
            leads or last led; C{partner_older}, this broker took over
            from the partner's.
        @raise ValueError: for PEER_STARTING without C{peer_role}.
        """
        if event is Event.PEER_STARTING and peer_role is None:
            raise ValueError("PEER_STARTING needs the partner's role (peer_role)")
        row = next(
            row
            for row in TABLE[(self.state, event)]
            if self._holds(
                row.guard, now, peer_role, in_sync, leads, peer_leads, partner_newer, partner_older
            )
        )
        actions = row.actions
        if event in PEER_EVENTS and self._reportedGone:
            self._reportedGone = False
            actions = (Action.REPORT_PARTNER_BACK, *actions)
        if Action.REPORT_PARTNER_GONE in actions:
            self._reportedGone = True
        self.state = row.next
        return Transition(row.next, actions)

    def _holds(
        self,
        guard: Guard,
        now: float,
        peer_role: Role | None,
        in_sync: bool,
        leads: bool = False,
        peer_leads: bool = False,
        partner_newer: bool = False,
        partner_older: bool = False,
    ) -> bool:
        """Whether C{guard} holds for an event at C{now} with these arguments."""
        match guard:
            case Guard.ALWAYS | Guard.OTHERWISE:
                return True
            case Guard.SAME_ROLE:
                return peer_role is self.role
            case Guard.PRIMARY:
                return self.role is Role.PRIMARY
            case Guard.PRIMARY_LEADS_PARTNER_SILENT:
                return self.role is Role.PRIMARY and leads and not self.partner_alive(now)
            case Guard.PARTNER_SILENT:
                return not self.partner_alive(now)
            case Guard.SAFE_TAKEOVER:
                return self.safe_takeover(now, in_sync)
            case Guard.PARTNER_NEWER:
                return partner_newer and not partner_older
            case Guard.PARTNER_OLDER:
                return partner_older and not partner_newer
            case Guard.IN_SYNC:
                return in_sync
            case Guard.LEADS:
                # (Both journals led a history: the one that took over from
                # the other's is the newer.)
                newer = partner_older and not partner_newer
                return (leads and not peer_leads) or (leads and peer_leads and newer)
            case Guard.PARTNER_LEADS:
                newer = partner_newer and not partner_older
                return (peer_leads and not leads) or (leads and peer_leads and newer)
            case Guard.NEWLY_SILENT:
                return not self.partner_alive(now) and not self._reportedGone
