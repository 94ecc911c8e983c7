"""
Tests for L{malamute_pack.pair.machine}: the pair's Binary Star table row by
row (with its guards: the partner's expiry at its exact boundary, being in
sync, the roles), the checks made on the table at import, its rendering as
text, and scenarios of two machines trading heartbeats: normal starts,
failover, partition, restarts, dual actives, dual passives, and the partner's
silence reported once. Time is plain floats (seconds).
"""

from __future__ import annotations

import itertools

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.pair.machine import (
    DEFAULT_HEARTBEAT,
    DEFAULT_MISSES,
    PEER_EVENTS,
    TABLE,
    Action,
    Event,
    Guard,
    PairMachine,
    Role,
    Row,
    State,
    Transition,
    check_table,
    render_table,
    table_problems,
)

P = Role.PRIMARY
B = Role.BACKUP
A = Action

# The heartbeat event a broker in each state sends its partner.
HEARTBEAT = {
    State.STARTING: Event.PEER_STARTING,
    State.ACTIVE: Event.PEER_ACTIVE,
    State.PASSIVE: Event.PEER_PASSIVE,
}


# The tests reason in a heartbeat a second, the partner gone after two
# missed (heartbeat=1.0, misses=2), not the defaults.


def other(role: Role) -> Role:
    """The role that is not C{role}."""
    return B if role is P else P


def hear(
    receiver: PairMachine, state: State, role: Role, now: float, in_sync: bool = False
) -> Transition:
    """C{receiver} hears at C{now} a heartbeat from a partner of C{role} in C{state}."""
    receiver.heard(now)
    return receiver.handle(HEARTBEAT[state], now, peer_role=role, in_sync=in_sync)


def beat(
    sender: PairMachine, receiver: PairMachine, now: float, in_sync: bool = False
) -> Transition:
    """C{sender}'s heartbeat, saying its current state, reaches C{receiver} at C{now}."""
    return hear(receiver, sender.state, sender.role, now, in_sync)


def peer_starting_heard(state: State, role: Role, **guards: bool) -> Transition:
    """
    What a machine of C{role} in C{state} does on the first heartbeat of
    its partner, starting (C{guards}: leads, partner_newer...).
    """
    machine = machine_in(state, role)
    machine.heard(0.5)
    return machine.handle(Event.PEER_STARTING, 0.5, peer_role=other(role), **guards)


def machine_in(state: State, role: Role, now: float = 0.0) -> PairMachine:
    """
    A machine of C{role} brought to C{state} at C{now} by the events that
    lead there, its partner last heard at C{now} (so alive until C{now + 2}).
    """
    machine = PairMachine(role, now, heartbeat=1.0, misses=2)
    if state is State.ACTIVE:
        hear(machine, State.PASSIVE, other(role), now)
    elif state is State.PASSIVE:
        hear(machine, State.ACTIVE, other(role), now)
    else:
        machine.heard(now)
    assert machine.state is state
    return machine


class ConstructionTests(SynchronousTestCase):
    """A new machine, its defaults and the partner's expiry."""

    def test_startsStarting(self) -> None:
        """A new machine is STARTING, with the role it was given."""
        machine = PairMachine(B, 10.0, heartbeat=1.0, misses=2)
        self.assertIs(machine.state, State.STARTING)
        self.assertIs(machine.role, B)

    def test_defaults(self) -> None:
        """
        By default the partner heartbeats every half second and is gone
        after three missed: 1.5 s.
        """
        self.assertEqual((DEFAULT_HEARTBEAT, DEFAULT_MISSES), (0.5, 3))
        machine = PairMachine(P, 10.0)
        self.assertEqual(machine.timeout, 1.5)

    def test_expiryBeforeFirstHeartbeat(self) -> None:
        """Before any heartbeat, the partner expires the timeout after the start."""
        machine = PairMachine(P, 10.0, heartbeat=0.5, misses=3)
        self.assertEqual(machine.peer_expiry, 11.5)
        self.assertTrue(machine.partner_alive(11.4))
        self.assertFalse(machine.partner_alive(11.5))

    def test_heardMovesExpiry(self) -> None:
        """A heartbeat heard at C{now} moves the expiry to C{now} plus the timeout."""
        machine = PairMachine(P, 0.0, heartbeat=1.0, misses=2)
        machine.heard(5.0)
        self.assertEqual(machine.peer_expiry, 7.0)

    def test_aliveUntilExactlyExpiry(self) -> None:
        """The partner is alive strictly before its expiry and gone at it."""
        machine = PairMachine(P, 0.0, heartbeat=1.0, misses=2)
        machine.heard(3.0)
        self.assertTrue(machine.partner_alive(4.999))
        self.assertFalse(machine.partner_alive(5.0))
        self.assertFalse(machine.partner_alive(6.0))

    def test_badTiming(self) -> None:
        """A heartbeat interval that is not positive, or fewer than one miss, is refused."""
        self.assertRaises(ValueError, PairMachine, P, 0.0, heartbeat=0.0)
        self.assertRaises(ValueError, PairMachine, P, 0.0, heartbeat=-1.0)
        self.assertRaises(ValueError, PairMachine, P, 0.0, misses=0)

    def test_peerStartingNeedsRole(self) -> None:
        """PEER_STARTING without the partner's role is a caller's error, and changes nothing."""
        machine = machine_in(State.PASSIVE, B)
        self.assertRaises(ValueError, machine.handle, Event.PEER_STARTING, 0.0)
        self.assertIs(machine.state, State.PASSIVE)


class StartingRowTests(SynchronousTestCase):
    """The rows of STARTING."""

    def test_peerStartingSameRole(self) -> None:
        """Two primaries, or two backups, report the configuration error and stay STARTING."""
        for role in Role:
            machine = machine_in(State.STARTING, role)
            self.assertEqual(
                hear(machine, State.STARTING, role, 0.5),
                Transition(State.STARTING, (A.REPORT_SAME_ROLE,)),
            )
            self.assertIs(machine.state, State.STARTING)

    def test_peerStartingPrimary(self) -> None:
        """A starting primary that hears the starting backup goes ACTIVE."""
        machine = machine_in(State.STARTING, P)
        self.assertEqual(
            hear(machine, State.STARTING, B, 0.5), Transition(State.ACTIVE, (A.BECOME_ACTIVE,))
        )
        self.assertIs(machine.state, State.ACTIVE)

    def test_peerStartingBackup(self) -> None:
        """A starting backup that hears the starting primary waits, STARTING."""
        machine = machine_in(State.STARTING, B)
        self.assertEqual(hear(machine, State.STARTING, P, 0.5), Transition(State.STARTING, ()))

    def test_peerStartingLeadership(self) -> None:
        """
        Between two starting brokers, the one whose journal leads the
        history (the last active) goes ACTIVE whatever its role, and the
        other waits, primary or not; when both or neither lead, the
        primary goes.
        """
        for role in Role:
            machine = machine_in(State.STARTING, role)
            machine.heard(0.5)
            self.assertEqual(
                machine.handle(Event.PEER_STARTING, 0.5, peer_role=other(role), leads=True),
                Transition(State.ACTIVE, (A.BECOME_ACTIVE,)),
            )
            machine = machine_in(State.STARTING, role)
            machine.heard(0.5)
            self.assertEqual(
                machine.handle(Event.PEER_STARTING, 0.5, peer_role=other(role), peer_leads=True),
                Transition(State.STARTING, ()),
            )
        machine = machine_in(State.STARTING, P)
        machine.heard(0.5)
        both = machine.handle(Event.PEER_STARTING, 0.5, peer_role=B, leads=True, peer_leads=True)
        self.assertEqual(both, Transition(State.ACTIVE, (A.BECOME_ACTIVE,)))

    def test_bothLeadTheNewerServes(self) -> None:
        """
        Two starting brokers whose journals both led a history (the active
        killed, the backup took over and was killed in turn): the one that
        took over from the other's history serves, whatever its role; the
        primary, whose history is the older, waits.
        """
        both = {"leads": True, "peer_leads": True}
        self.assertEqual(
            peer_starting_heard(State.STARTING, P, partner_newer=True, **both),
            Transition(State.STARTING, ()),
        )
        self.assertEqual(
            peer_starting_heard(State.STARTING, B, partner_older=True, **both),
            Transition(State.ACTIVE, (A.BECOME_ACTIVE,)),
        )

    def test_startingNewerHistoryServes(self) -> None:
        """
        Between two starting brokers the history decides before who led
        last: the one whose journal took over from the other's serves even
        if it leads no more (it stopped serving while its partner was
        silent, after acknowledging records alone), and the other waits,
        even if it is the primary.
        """
        self.assertEqual(
            peer_starting_heard(State.STARTING, P, partner_newer=True),
            Transition(State.STARTING, ()),
        )
        self.assertEqual(
            peer_starting_heard(State.STARTING, B, partner_older=True),
            Transition(State.ACTIVE, (A.BECOME_ACTIVE,)),
        )

    def test_activeYieldsToRestartedNewerPartner(self) -> None:
        """
        An active that hears its partner starting again, with a journal
        that took over from the history this one serves (it served the
        clients this one refused, then died), yields: PASSIVE (its
        process stops, and both settle as starting brokers); any other
        restarted partner finds it still ACTIVE.
        """
        for role in Role:
            self.assertEqual(
                peer_starting_heard(State.ACTIVE, role, partner_newer=True),
                Transition(State.PASSIVE, (A.BECOME_PASSIVE,)),
            )
            self.assertEqual(peer_starting_heard(State.ACTIVE, role), Transition(State.ACTIVE, ()))

    def test_peerActive(self) -> None:
        """A starting broker of either role that hears an ACTIVE partner goes PASSIVE."""
        for role in Role:
            machine = machine_in(State.STARTING, role)
            self.assertEqual(
                hear(machine, State.ACTIVE, other(role), 0.5),
                Transition(State.PASSIVE, (A.BECOME_PASSIVE,)),
            )
            self.assertIs(machine.state, State.PASSIVE)

    def test_peerActiveOlderHistory(self) -> None:
        """
        A starting broker whose journal took over from the history its
        ACTIVE partner serves stays STARTING (the partner, hearing it, yields),
        whatever its role: going passive would cut its newer history back.
        """
        for role in Role:
            machine = machine_in(State.STARTING, role)
            machine.heard(0.5)
            self.assertEqual(
                machine.handle(Event.PEER_ACTIVE, 0.5, peer_role=other(role), partner_older=True),
                Transition(State.STARTING, ()),
            )

    def test_peerPassive(self) -> None:
        """A starting broker of either role that hears a PASSIVE partner goes ACTIVE."""
        for role in Role:
            machine = machine_in(State.STARTING, role)
            self.assertEqual(
                hear(machine, State.PASSIVE, other(role), 0.5),
                Transition(State.ACTIVE, (A.BECOME_ACTIVE,)),
            )

    def test_clientPrimaryPartnerSilent(self) -> None:
        """
        A client of a starting primary that may serve alone (a new pair's
        journal, or alone-after passed: leads) whose partner is silent, from
        exactly its expiry on, makes it ACTIVE and is accepted.
        """
        machine = PairMachine(P, 10.0, heartbeat=1.0, misses=2)
        self.assertEqual(
            machine.handle(Event.CLIENT_REQUEST, 12.0, leads=True),
            Transition(State.ACTIVE, (A.BECOME_ACTIVE, A.ACCEPT_CLIENT)),
        )
        self.assertIs(machine.state, State.ACTIVE)

    def test_clientPrimaryThatDoesNotLead(self) -> None:
        """
        A starting primary that may not serve alone (its journal holds a
        history the backup may have gone on with) never serves alone,
        however long its partner is silent: it would serve without what the
        backup acknowledged after taking over.
        """
        machine = PairMachine(P, 10.0, heartbeat=1.0, misses=2)
        for now in (12.0, 100.0, 10_000.0):
            self.assertEqual(
                machine.handle(Event.CLIENT_REQUEST, now, leads=False),
                Transition(State.STARTING, (A.REFUSE_CLIENT,)),
            )

    def test_clientPrimaryPartnerAlive(self) -> None:
        """
        A client of a starting primary is refused while the partner may be
        alive (just before the expiry): the backup may be serving.
        """
        machine = PairMachine(P, 10.0, heartbeat=1.0, misses=2)
        self.assertEqual(
            machine.handle(Event.CLIENT_REQUEST, 11.999),
            Transition(State.STARTING, (A.REFUSE_CLIENT,)),
        )
        machine.heard(20.0)
        self.assertEqual(
            machine.handle(Event.CLIENT_REQUEST, 21.0),
            Transition(State.STARTING, (A.REFUSE_CLIENT,)),
        )

    def test_clientBackup(self) -> None:
        """A starting backup refuses clients, with its partner alive or silent."""
        machine = PairMachine(B, 10.0, heartbeat=1.0, misses=2)
        for now in (11.0, 12.0, 100.0):
            self.assertEqual(
                machine.handle(Event.CLIENT_REQUEST, now),
                Transition(State.STARTING, (A.REFUSE_CLIENT,)),
            )


class ActiveRowTests(SynchronousTestCase):
    """The rows of ACTIVE."""

    def test_peerStarting(self) -> None:
        """An active broker that hears its partner start stays ACTIVE, doing nothing."""
        for role in Role:
            machine = machine_in(State.ACTIVE, role)
            self.assertEqual(
                hear(machine, State.STARTING, other(role), 1.0), Transition(State.ACTIVE, ())
            )

    def test_dualActivePrimary(self) -> None:
        """An active primary that hears an ACTIVE partner reports it and stays ACTIVE."""
        machine = machine_in(State.ACTIVE, P)
        self.assertEqual(
            hear(machine, State.ACTIVE, B, 1.0),
            Transition(State.ACTIVE, (A.REPORT_DUAL_ACTIVE,)),
        )

    def test_dualActiveBackup(self) -> None:
        """An active backup that hears an ACTIVE partner reports it and yields: PASSIVE."""
        machine = machine_in(State.ACTIVE, B)
        self.assertEqual(
            hear(machine, State.ACTIVE, P, 1.0),
            Transition(State.PASSIVE, (A.REPORT_DUAL_ACTIVE, A.BECOME_PASSIVE)),
        )
        self.assertIs(machine.state, State.PASSIVE)

    def test_peerPassive(self) -> None:
        """An active broker that hears a PASSIVE partner stays ACTIVE, doing nothing."""
        for role in Role:
            machine = machine_in(State.ACTIVE, role)
            self.assertEqual(
                hear(machine, State.PASSIVE, other(role), 1.0), Transition(State.ACTIVE, ())
            )

    def test_client(self) -> None:
        """An active broker accepts clients, its partner alive or silent."""
        for role in Role:
            machine = machine_in(State.ACTIVE, role)
            for now in (1.0, 2.0, 50.0):
                self.assertEqual(
                    machine.handle(Event.CLIENT_REQUEST, now),
                    Transition(State.ACTIVE, (A.ACCEPT_CLIENT,)),
                )


class PassiveRowTests(SynchronousTestCase):
    """The rows of PASSIVE."""

    def test_peerStartingInSync(self) -> None:
        """
        A passive broker in sync whose partner restarted takes over: ACTIVE
        (the partner will hear that and go passive).
        """
        for role in Role:
            machine = machine_in(State.PASSIVE, role)
            self.assertEqual(
                hear(machine, State.STARTING, other(role), 1.0, in_sync=True),
                Transition(State.ACTIVE, (A.BECOME_ACTIVE, A.TAKE_OVER)),
            )

    def test_peerStartingNotInSync(self) -> None:
        """
        A passive broker not in sync whose partner restarted stays PASSIVE
        (the partner will hear that and go active).
        """
        for role in Role:
            machine = machine_in(State.PASSIVE, role)
            self.assertEqual(
                hear(machine, State.STARTING, other(role), 1.0, in_sync=False),
                Transition(State.PASSIVE, ()),
            )

    def test_peerActive(self) -> None:
        """A passive broker that hears an ACTIVE partner stays PASSIVE, doing nothing."""
        for role in Role:
            machine = machine_in(State.PASSIVE, role)
            self.assertEqual(
                hear(machine, State.ACTIVE, other(role), 1.0), Transition(State.PASSIVE, ())
            )

    def test_dualPassivePrimary(self) -> None:
        """A passive primary that hears a PASSIVE partner goes ACTIVE, taking over."""
        machine = machine_in(State.PASSIVE, P)
        self.assertEqual(
            hear(machine, State.PASSIVE, B, 1.0),
            Transition(State.ACTIVE, (A.BECOME_ACTIVE, A.TAKE_OVER)),
        )

    def test_dualPassiveBackup(self) -> None:
        """A passive backup that hears a PASSIVE partner stays PASSIVE (the primary moves)."""
        machine = machine_in(State.PASSIVE, B)
        self.assertEqual(hear(machine, State.PASSIVE, P, 1.0), Transition(State.PASSIVE, ()))

    def test_clientPartnerSilent(self) -> None:
        """
        A client of a passive broker whose partner is silent, from exactly
        its expiry on, makes it take over, and is accepted (either role).
        """
        for role in Role:
            machine = machine_in(State.PASSIVE, role, now=5.0)
            self.assertEqual(
                machine.handle(Event.CLIENT_REQUEST, 7.0, in_sync=True),
                Transition(State.ACTIVE, (A.BECOME_ACTIVE, A.TAKE_OVER, A.ACCEPT_CLIENT)),
            )

    def test_clientPartnerAlive(self) -> None:
        """A client of a passive broker whose partner is alive (just before expiry) is refused."""
        for role in Role:
            machine = machine_in(State.PASSIVE, role, now=5.0)
            self.assertEqual(
                machine.handle(Event.CLIENT_REQUEST, 6.999),
                Transition(State.PASSIVE, (A.REFUSE_CLIENT,)),
            )


class SilenceRowTests(SynchronousTestCase):
    """PEER_SILENT in every state, and the report of the partner's return."""

    def test_reportedOnceInEveryState(self) -> None:
        """
        In every state, the partner's silence is reported the first time
        and not again, and the state does not change.
        """
        for state, role in itertools.product(State, Role):
            machine = machine_in(state, role)
            self.assertEqual(
                machine.handle(Event.PEER_SILENT, 2.0),
                Transition(state, (A.REPORT_PARTNER_GONE,)),
            )
            self.assertEqual(machine.handle(Event.PEER_SILENT, 3.0), Transition(state, ()))
            self.assertIs(machine.state, state)

    def test_notSilentYet(self) -> None:
        """PEER_SILENT fed before the expiry (a heartbeat just arrived) reports nothing."""
        machine = machine_in(State.ACTIVE, P)
        self.assertEqual(machine.handle(Event.PEER_SILENT, 1.999), Transition(State.ACTIVE, ()))
        self.assertEqual(
            machine.handle(Event.PEER_SILENT, 2.0),
            Transition(State.ACTIVE, (A.REPORT_PARTNER_GONE,)),
        )

    def test_backReportedOnNextPeerEvent(self) -> None:
        """
        After a reported silence, the next peer event reports the partner
        back before its row's actions, once.
        """
        machine = machine_in(State.STARTING, P)
        machine.handle(Event.PEER_SILENT, 2.0)
        self.assertEqual(
            hear(machine, State.STARTING, B, 3.0),
            Transition(State.ACTIVE, (A.REPORT_PARTNER_BACK, A.BECOME_ACTIVE)),
        )
        self.assertEqual(hear(machine, State.PASSIVE, B, 4.0), Transition(State.ACTIVE, ()))

    def test_clientDoesNotReportBack(self) -> None:
        """A client request is no news of the partner: it does not report it back."""
        machine = machine_in(State.ACTIVE, P)
        machine.handle(Event.PEER_SILENT, 2.0)
        self.assertEqual(
            machine.handle(Event.CLIENT_REQUEST, 3.0), Transition(State.ACTIVE, (A.ACCEPT_CLIENT,))
        )

    def test_noBackWithoutGone(self) -> None:
        """A peer event after an unreported (or no) silence reports nothing extra."""
        machine = machine_in(State.PASSIVE, B)
        self.assertEqual(hear(machine, State.ACTIVE, P, 10.0), Transition(State.PASSIVE, ()))


class TableTests(SynchronousTestCase):
    """The table itself: checked at import, its checks, its text."""

    def test_everyPairHasRows(self) -> None:
        """Every state has rows for every event, and the table passes its own checks."""
        self.assertEqual(set(TABLE), set(itertools.product(State, Event)))
        self.assertEqual(table_problems(TABLE), [])
        check_table(TABLE)

    def test_clientEveryCombination(self) -> None:
        """
        Whatever the state, role and partner, a client request is accepted
        exactly when the broker ends ACTIVE, and refused otherwise.
        """
        for state, role, now in itertools.product(State, Role, (1.0, 2.0)):
            machine = machine_in(state, role)
            transition = machine.handle(Event.CLIENT_REQUEST, now)
            self.assertEqual(transition.state, machine.state)
            self.assertEqual(
                transition.actions[-1],
                A.ACCEPT_CLIENT if machine.state is State.ACTIVE else A.REFUSE_CLIENT,
            )

    def test_missingRow(self) -> None:
        """A table without a pair of state and event is refused."""
        table = dict(TABLE)
        del table[(State.ACTIVE, Event.PEER_PASSIVE)]
        self.assertEqual(table_problems(table), ["active + peer_passive: no row"])
        self.assertRaises(ValueError, check_table, table)

    def test_undecidedCase(self) -> None:
        """Rows that do not end in an unconditional one leave a case undecided: refused."""
        table = dict(TABLE)
        table[(State.PASSIVE, Event.PEER_PASSIVE)] = (
            Row(Guard.PRIMARY, (A.BECOME_ACTIVE, A.TAKE_OVER), State.ACTIVE),
        )
        self.assertEqual(
            table_problems(table), ["passive + peer_passive: the last row's guard must be always"]
        )

    def test_unreachableRow(self) -> None:
        """A row after an unconditional one never applies: refused."""
        table = dict(TABLE)
        table[(State.ACTIVE, Event.PEER_PASSIVE)] = (
            Row(Guard.OTHERWISE, (), State.ACTIVE),
            Row(Guard.OTHERWISE, (), State.ACTIVE),
        )
        self.assertIn(
            "active + peer_passive: a row after an unconditional one never applies",
            table_problems(table),
        )

    def test_clientNeitherAcceptedNorRefused(self) -> None:
        """A client request row without exactly one final accept or refuse is refused."""
        for actions in [(), (A.ACCEPT_CLIENT, A.REFUSE_CLIENT), (A.REFUSE_CLIENT, A.ACCEPT_CLIENT)]:
            table = dict(TABLE)
            table[(State.ACTIVE, Event.CLIENT_REQUEST)] = (
                Row(Guard.ALWAYS, actions, State.ACTIVE),
            )
            self.assertEqual(
                table_problems(table),
                [
                    "active + client_request [always]: a client request must end in exactly"
                    " one of accept or refuse"
                ],
            )

    def test_transitionWithoutItsAction(self) -> None:
        """
        A move into ACTIVE without BECOME_ACTIVE, from PASSIVE without
        TAKE_OVER, or into PASSIVE without BECOME_PASSIVE is refused.
        """
        cases = [
            (State.STARTING, Event.PEER_PASSIVE, Row(Guard.ALWAYS, (), State.ACTIVE)),
            (
                State.PASSIVE,
                Event.PEER_PASSIVE,
                Row(Guard.ALWAYS, (A.BECOME_ACTIVE,), State.ACTIVE),
            ),
            (State.STARTING, Event.PEER_ACTIVE, Row(Guard.ALWAYS, (), State.PASSIVE)),
            (State.ACTIVE, Event.PEER_PASSIVE, Row(Guard.ALWAYS, (A.TAKE_OVER,), State.ACTIVE)),
        ]
        for state, event, bad in cases:
            table = dict(TABLE)
            table[(state, event)] = (bad,)
            self.assertEqual(len(table_problems(table)), 1, (state, event, bad))

    def test_silenceChangesNoState(self) -> None:
        """A PEER_SILENT row that changes state, or reports the partner back, is refused."""
        for bad in [
            Row(Guard.ALWAYS, (A.BECOME_ACTIVE,), State.ACTIVE),
            Row(Guard.ALWAYS, (A.REPORT_PARTNER_BACK,), State.PASSIVE),
        ]:
            table = dict(TABLE)
            table[(State.PASSIVE, Event.PEER_SILENT)] = (bad,)
            self.assertNotEqual(table_problems(table), [])

    def test_guardsWhereTheirInputIs(self) -> None:
        """SAME_ROLE outside PEER_STARTING, or NEWLY_SILENT outside PEER_SILENT, is refused."""
        table = dict(TABLE)
        table[(State.ACTIVE, Event.PEER_ACTIVE)] = (
            Row(Guard.SAME_ROLE, (), State.ACTIVE),
            Row(Guard.NEWLY_SILENT, (), State.ACTIVE),
            Row(Guard.OTHERWISE, (), State.ACTIVE),
        )
        self.assertEqual(len(table_problems(table)), 2)

    def test_rendered(self) -> None:
        """The table renders a line a row, in order, then the rule for the partner's return."""
        lines = render_table()
        self.assertEqual(len(lines), sum(len(rows) for rows in TABLE.values()) + 1)
        self.assertEqual(
            lines[0], "starting + peer_starting [same role] -> report_same_role -> starting"
        )
        self.assertIn("starting + peer_active [otherwise] -> become_passive -> passive", lines)
        self.assertIn(
            "passive + client_request [partner silent, in sync]"
            " -> become_active, take_over, accept_client -> active",
            lines,
        )
        self.assertIn("active + peer_starting [otherwise] -> - -> active", lines)
        self.assertTrue(lines[-1].startswith("any + peer_starting/peer_active/peer_passive"))

    def test_peerEvents(self) -> None:
        """The peer events are the three heartbeat states, not clients nor silence."""
        self.assertEqual(PEER_EVENTS, frozenset(HEARTBEAT.values()))


class ScenarioTests(SynchronousTestCase):
    """Two machines trading heartbeats (delivered by the test) and clients, over time."""

    def test_primaryFirst(self) -> None:
        """
        A primary that starts alone refuses clients for the timeout, then
        serves; the backup that starts later goes passive and refuses clients.
        """
        primary = PairMachine(P, 0.0, heartbeat=1.0, misses=2)
        # (Its journal leads, or holds no history yet.)
        self.assertEqual(
            primary.handle(Event.CLIENT_REQUEST, 1.0, leads=True).actions, (A.REFUSE_CLIENT,)
        )
        self.assertEqual(
            primary.handle(Event.CLIENT_REQUEST, 2.0, leads=True).actions,
            (A.BECOME_ACTIVE, A.ACCEPT_CLIENT),
        )
        backup = PairMachine(B, 3.0, heartbeat=1.0, misses=2)
        self.assertEqual(beat(backup, primary, 3.0), Transition(State.ACTIVE, ()))
        self.assertEqual(beat(primary, backup, 3.1).actions, (A.BECOME_PASSIVE,))
        self.assertEqual(beat(backup, primary, 4.0), Transition(State.ACTIVE, ()))
        self.assertEqual(backup.handle(Event.CLIENT_REQUEST, 4.5).actions, (A.REFUSE_CLIENT,))
        self.assertEqual(primary.handle(Event.CLIENT_REQUEST, 4.5).actions, (A.ACCEPT_CLIENT,))

    def test_bothStartTogether(self) -> None:
        """
        Started together, the primary goes active on the backup's heartbeat,
        and the backup passive on the primary's next one.
        """
        primary = PairMachine(P, 0.0, heartbeat=1.0, misses=2)
        backup = PairMachine(B, 0.0, heartbeat=1.0, misses=2)
        self.assertEqual(beat(primary, backup, 0.1), Transition(State.STARTING, ()))
        self.assertEqual(beat(backup, primary, 0.1).actions, (A.BECOME_ACTIVE,))
        self.assertEqual(beat(primary, backup, 1.1).actions, (A.BECOME_PASSIVE,))
        self.assertEqual((primary.state, backup.state), (State.ACTIVE, State.PASSIVE))

    def test_backupFirst(self) -> None:
        """
        A backup that starts alone refuses clients however long it waits;
        when the primary starts, the primary goes active and the backup passive.
        """
        backup = PairMachine(B, 0.0, heartbeat=1.0, misses=2)
        for now in (1.0, 2.0, 30.0):
            self.assertEqual(backup.handle(Event.CLIENT_REQUEST, now).actions, (A.REFUSE_CLIENT,))
        primary = PairMachine(P, 30.0, heartbeat=1.0, misses=2)
        self.assertEqual(beat(backup, primary, 30.1).actions, (A.BECOME_ACTIVE,))
        self.assertEqual(beat(primary, backup, 30.2).actions, (A.BECOME_PASSIVE,))
        self.assertEqual(backup.handle(Event.CLIENT_REQUEST, 30.5).actions, (A.REFUSE_CLIENT,))

    def running(self) -> tuple[PairMachine, PairMachine]:
        """A primary ACTIVE and a backup PASSIVE, trading heartbeats every second to 5.0."""
        primary = PairMachine(P, 0.0, heartbeat=1.0, misses=2)
        backup = PairMachine(B, 0.0, heartbeat=1.0, misses=2)
        beat(backup, primary, 0.0)
        for second in range(6):
            beat(primary, backup, float(second))
            beat(backup, primary, float(second))
        self.assertEqual((primary.state, backup.state), (State.ACTIVE, State.PASSIVE))
        return primary, backup

    def test_activeCrashFailover(self) -> None:
        """
        The active crashes; a client turning to the passive is refused until
        the active's expiry, then the passive takes over and serves it.
        """
        _, backup = self.running()
        # The primary crashed just after its heartbeat at 5.0.
        self.assertEqual(backup.handle(Event.CLIENT_REQUEST, 6.5).actions, (A.REFUSE_CLIENT,))
        self.assertEqual(backup.handle(Event.PEER_SILENT, 7.0).actions, (A.REPORT_PARTNER_GONE,))
        self.assertEqual(
            backup.handle(Event.CLIENT_REQUEST, 7.0, in_sync=True),
            Transition(State.ACTIVE, (A.BECOME_ACTIVE, A.TAKE_OVER, A.ACCEPT_CLIENT)),
        )
        self.assertEqual(backup.handle(Event.CLIENT_REQUEST, 7.5).actions, (A.ACCEPT_CLIENT,))

    def test_partition(self) -> None:
        """
        The link between the brokers breaks: both report the partner gone,
        the active keeps serving, and the passive stays passive for as long
        as no client turns to it.
        """
        primary, backup = self.running()
        for now in (7.0, 8.0, 60.0):
            primary.handle(Event.PEER_SILENT, now)
            backup.handle(Event.PEER_SILENT, now)
            self.assertEqual(primary.handle(Event.CLIENT_REQUEST, now).actions, (A.ACCEPT_CLIENT,))
        self.assertEqual((primary.state, backup.state), (State.ACTIVE, State.PASSIVE))

    def test_clientToPassiveWhileActiveAlive(self) -> None:
        """
        A client that turns to the passive while the active's heartbeats
        still arrive (it lost only its own route to the active) is refused.
        """
        primary, backup = self.running()
        for second in range(6, 30):
            beat(primary, backup, float(second))
            self.assertEqual(
                backup.handle(Event.CLIENT_REQUEST, second + 0.9),
                Transition(State.PASSIVE, (A.REFUSE_CLIENT,)),
            )

    def test_oldActiveRestartsPassive(self) -> None:
        """
        After a failover the old active restarts: it hears the new active
        and goes passive, and the new active stays active.
        """
        _, backup = self.running()
        backup.handle(Event.PEER_SILENT, 7.0)
        backup.handle(Event.CLIENT_REQUEST, 7.0, in_sync=True)
        primary = PairMachine(P, 20.0, heartbeat=1.0, misses=2)
        self.assertEqual(
            beat(primary, backup, 20.1), Transition(State.ACTIVE, (A.REPORT_PARTNER_BACK,))
        )
        self.assertEqual(beat(backup, primary, 20.2).actions, (A.BECOME_PASSIVE,))
        self.assertEqual(primary.handle(Event.CLIENT_REQUEST, 20.5).actions, (A.REFUSE_CLIENT,))
        self.assertEqual((primary.state, backup.state), (State.PASSIVE, State.ACTIVE))

    def test_activeRestartsBeforeFailoverInSync(self) -> None:
        """
        The active restarts before any client turned to the passive; the
        passive, in sync, takes over, and the restarted one goes passive.
        """
        _, backup = self.running()
        primary = PairMachine(P, 5.5, heartbeat=1.0, misses=2)
        self.assertEqual(
            beat(primary, backup, 5.6, in_sync=True).actions, (A.BECOME_ACTIVE, A.TAKE_OVER)
        )
        self.assertEqual(beat(backup, primary, 5.7).actions, (A.BECOME_PASSIVE,))
        self.assertEqual((primary.state, backup.state), (State.PASSIVE, State.ACTIVE))

    def test_activeRestartsBeforeFailoverNotInSync(self) -> None:
        """
        The active restarts; the passive, not in sync, stays passive, and the
        restarted one (whose journal is the complete one) goes active again.
        """
        _, backup = self.running()
        primary = PairMachine(P, 5.5, heartbeat=1.0, misses=2)
        self.assertEqual(beat(primary, backup, 5.6, in_sync=False).actions, ())
        self.assertEqual(beat(backup, primary, 5.7).actions, (A.BECOME_ACTIVE,))
        self.assertEqual(beat(primary, backup, 6.0).actions, ())
        self.assertEqual((primary.state, backup.state), (State.ACTIVE, State.PASSIVE))

    def test_passiveRestarts(self) -> None:
        """The passive restarts while the active runs: it goes passive again; the active stays."""
        primary, _ = self.running()
        backup = PairMachine(B, 5.5, heartbeat=1.0, misses=2)
        self.assertEqual(beat(backup, primary, 5.6), Transition(State.ACTIVE, ()))
        self.assertEqual(beat(primary, backup, 6.0).actions, (A.BECOME_PASSIVE,))
        self.assertEqual(primary.handle(Event.CLIENT_REQUEST, 6.5).actions, (A.ACCEPT_CLIENT,))
        self.assertEqual(backup.handle(Event.CLIENT_REQUEST, 6.5).actions, (A.REFUSE_CLIENT,))

    def test_dualActives(self) -> None:
        """
        A partition during which clients reach only the passive makes it
        take over; when the link comes back both report dual actives and
        the backup yields.
        """
        primary, backup = self.running()
        backup.handle(Event.PEER_SILENT, 7.0)
        primary.handle(Event.PEER_SILENT, 7.0)
        self.assertEqual(backup.handle(Event.CLIENT_REQUEST, 7.5, in_sync=True).state, State.ACTIVE)
        self.assertEqual(
            beat(primary, backup, 10.0),
            Transition(
                State.PASSIVE, (A.REPORT_PARTNER_BACK, A.REPORT_DUAL_ACTIVE, A.BECOME_PASSIVE)
            ),
        )
        # The backup's last ACTIVE heartbeat crosses its yielding.
        self.assertEqual(
            hear(primary, State.ACTIVE, B, 10.0),
            Transition(State.ACTIVE, (A.REPORT_PARTNER_BACK, A.REPORT_DUAL_ACTIVE)),
        )
        self.assertEqual(beat(backup, primary, 11.0), Transition(State.ACTIVE, ()))
        self.assertEqual((primary.state, backup.state), (State.ACTIVE, State.PASSIVE))

    def test_dualPassives(self) -> None:
        """
        Crossed heartbeats leave both passive (the backup yielded to a dual
        active while the primary, restarting, heard the backup's last ACTIVE
        heartbeat); the primary then goes active and the backup stays passive.
        """
        primary, backup = self.running()
        backup.handle(Event.CLIENT_REQUEST, 7.5, in_sync=True)
        # The primary's ACTIVE heartbeat reaches the backup; then it crashes and restarts.
        beat(primary, backup, 10.0)
        primary = PairMachine(P, 10.5, heartbeat=1.0, misses=2)
        hear(primary, State.ACTIVE, B, 10.5)
        self.assertEqual((primary.state, backup.state), (State.PASSIVE, State.PASSIVE))
        self.assertEqual(beat(primary, backup, 11.0), Transition(State.PASSIVE, ()))
        self.assertEqual(
            beat(backup, primary, 11.0), Transition(State.ACTIVE, (A.BECOME_ACTIVE, A.TAKE_OVER))
        )
        self.assertEqual(beat(primary, backup, 12.0), Transition(State.PASSIVE, ()))
        self.assertEqual((primary.state, backup.state), (State.ACTIVE, State.PASSIVE))

    def test_silenceReportedOnce(self) -> None:
        """
        The partner's silence is reported once however often the service
        feeds it, its return once, and a second silence again once.
        """
        primary, _ = self.running()
        reports = [primary.handle(Event.PEER_SILENT, t).actions for t in (7.0, 7.5, 8.0, 9.0)]
        self.assertEqual(reports, [(A.REPORT_PARTNER_GONE,), (), (), ()])
        self.assertEqual(hear(primary, State.PASSIVE, B, 10.0).actions, (A.REPORT_PARTNER_BACK,))
        self.assertEqual(primary.handle(Event.PEER_SILENT, 11.0).actions, ())
        self.assertEqual(hear(primary, State.PASSIVE, B, 11.0).actions, ())
        reports = [primary.handle(Event.PEER_SILENT, t).actions for t in (13.0, 14.0)]
        self.assertEqual(reports, [(A.REPORT_PARTNER_GONE,), ()])


class SafetyTests(SynchronousTestCase):
    """
    Stalls of this process are not the partner's silence; an active goes
    on alone only after alone-after, and a passive takes over only in sync
    and within alone-after (less a heartbeat) of hearing the active; of two
    actives, the newer serves.
    """

    def running(self, alone_after: float | None = 10.0) -> tuple[PairMachine, PairMachine]:
        """
        A primary ACTIVE and a backup PASSIVE, heartbeats every second to
        5.0, seen; going alone after C{alone_after} of silence (None: never).
        """
        primary = PairMachine(P, 0.0, heartbeat=1.0, misses=2, alone_after=alone_after)
        backup = PairMachine(B, 0.0, heartbeat=1.0, misses=2, alone_after=alone_after)
        beat(backup, primary, 0.0)
        for second in range(6):
            for machine in (primary, backup):
                machine.observe(float(second))
            beat(primary, backup, float(second))
            beat(backup, primary, float(second), in_sync=True)
        self.assertEqual((primary.state, backup.state), (State.ACTIVE, State.PASSIVE))
        return primary, backup

    def test_stallIsNotSilence(self) -> None:
        """
        A broker stalled for 15 s (SIGSTOP) finds its partner alive when it
        resumes, and silent only after the timeout of its own running time.
        """
        primary, _ = self.running()
        primary.observe(20.0)  # the first thing it sees after the stall
        self.assertTrue(primary.partner_alive(20.0))
        self.assertFalse(primary.alone(20.0))
        self.assertEqual(primary.stalls, 1)
        for now in (21.0, 22.0):
            primary.observe(now)
        self.assertFalse(primary.partner_alive(22.0))

    def test_regularTicksCountSilence(self) -> None:
        """Ticks a heartbeat apart are no stall: the partner goes silent on time."""
        primary, _ = self.running()
        for now in (6.0, 7.0):
            primary.observe(now)
        self.assertFalse(primary.partner_alive(7.0))
        self.assertEqual(primary.stalls, 0)

    def test_aloneAfter(self) -> None:
        """An active goes on alone after alone-after of silence, not at the timeout."""
        primary, _ = self.running()
        for second in range(6, 15):
            primary.observe(float(second))
            self.assertFalse(primary.alone(float(second)), second)
        primary.observe(15.0)
        self.assertTrue(primary.alone(15.0))

    def test_neverAloneOnSilenceByDefault(self) -> None:
        """
        Without alone-after, silence never makes an active go alone, and a
        passive in sync takes over however long ago it heard the active.
        """
        primary, backup = self.running(alone_after=None)
        for second in range(6, 60):
            primary.observe(float(second))
            backup.observe(float(second))
        self.assertFalse(primary.alone(59.0))
        self.assertEqual(
            backup.handle(Event.CLIENT_REQUEST, 59.0, in_sync=True).state, State.ACTIVE
        )

    def test_aloneAfterTooShortRefused(self) -> None:
        """An alone-after shorter than the timeout and two heartbeats is refused."""
        self.assertRaises(ValueError, PairMachine, P, 0.0, heartbeat=1.0, misses=2, alone_after=3.0)
        self.assertEqual(PairMachine(P, 0.0, 1.0, 2, alone_after=4.0).alone_after, 4.0)

    def test_noTakeoverOutOfSync(self) -> None:
        """
        A passive not in sync (catching up) whose active is silent refuses a
        client and says why, instead of taking over without what the active
        acknowledged alone.
        """
        _, backup = self.running()
        backup.observe(6.0)
        backup.observe(7.0)
        self.assertEqual(
            backup.handle(Event.CLIENT_REQUEST, 7.0, in_sync=False),
            Transition(State.PASSIVE, (A.REPORT_NO_TAKEOVER, A.REFUSE_CLIENT)),
        )

    def test_noTakeoverTooLate(self) -> None:
        """
        A passive in sync whose active fell silent longer ago than
        alone-after less a heartbeat does not take over: the active may
        have acknowledged alone since.
        """
        _, backup = self.running()
        for second in range(6, 15):
            backup.observe(float(second))
        self.assertEqual(
            backup.handle(Event.CLIENT_REQUEST, 14.0, in_sync=True).state, State.PASSIVE
        )
        backup = self.running()[1]
        backup.observe(6.0)
        backup.observe(7.0)
        self.assertEqual(backup.handle(Event.CLIENT_REQUEST, 7.0, in_sync=True).state, State.ACTIVE)

    def test_pausedPassiveDoesNotTakeOver(self) -> None:
        """
        A passive paused for longer than alone-after finds, once it has run
        for the timeout, a silent active, but does not take over: pauses
        count against the takeover (the active may have gone on alone).
        """
        _, backup = self.running()
        backup.observe(30.0)  # resumed after a 25 s stall
        self.assertEqual(backup.handle(Event.CLIENT_REQUEST, 30.0, in_sync=True).actions[-1:],
                         (A.REFUSE_CLIENT,))  # fmt: skip
        for now in (31.0, 32.0):
            backup.observe(now)
        self.assertEqual(
            backup.handle(Event.CLIENT_REQUEST, 32.0, in_sync=True),
            Transition(State.PASSIVE, (A.REPORT_NO_TAKEOVER, A.REFUSE_CLIENT)),
        )

    def test_pausedActiveYieldsToNewer(self) -> None:
        """
        The active is paused; a client makes the passive (in sync) take over;
        the old active resumes, is not alone, and on the new active's
        heartbeat (it took over from the old one's history) yields; the new
        one, hearing the old, stays.
        """
        primary, backup = self.running()
        backup.observe(6.0)
        backup.observe(7.0)
        self.assertEqual(backup.handle(Event.CLIENT_REQUEST, 7.0, in_sync=True).state, State.ACTIVE)
        primary.observe(20.0)
        self.assertFalse(primary.alone(20.0))
        primary.heard(20.0)
        self.assertEqual(
            primary.handle(Event.PEER_ACTIVE, 20.0, partner_newer=True),
            Transition(State.PASSIVE, (A.REPORT_DUAL_ACTIVE, A.BECOME_PASSIVE)),
        )
        backup.heard(20.0)
        self.assertEqual(
            backup.handle(Event.PEER_ACTIVE, 20.0, partner_older=True),
            Transition(State.ACTIVE, (A.REPORT_DUAL_ACTIVE,)),
        )
