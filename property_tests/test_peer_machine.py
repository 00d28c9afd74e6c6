"""A focused machine for peers: local models, peer models on two peers and pools mixing both.

The environment keeps its own account of what it was told (which peers are down, what is forwarded where,
which models failed which request) and checks every step's commands against it, besides ``check(state)``
after every step:

- INV-PEER-LIMIT: a ``Forward`` goes only to a peer that has fewer than ``max_in_flight`` requests forwarded;
- INV-PEER-DOWN: never to a peer reported down (by ``PeerState`` or a ``PeerFailed`` with ``down``) and not
  reported up since;
- INV-HOP: never for a request that came from another router (``local_only``);
- INV-PEER-FALLBACK: never to a model whose peer failed that very request before; a pooled request that a
  peer failed waits again or is answered in that step, and a direct one is answered in that step;
- every request ends exactly once (answered, finished, or its client gone);
- the answers peers cause carry their code (INV-HOP, INV-PEER-FALLBACK, INV-PEER-DOWN), and a peer's status
  only in the step of its ``PeerFailed``: ``loop_detected`` only to a request from another router;
  ``peer_failed`` or ``peer_unreachable`` only to one a peer failed, and to such a one whenever it is
  answered for lack of a candidate (this machine's local models can always load, so a lack of candidates is
  always the peers' doing); ``peer_unreachable`` only in the step of a ``PeerFailed`` that took its peer
  down; ``model_unavailable`` only while a peer is down.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from statemachine import (
    ClientGone,
    Command,
    Dispatch,
    Event,
    Forward,
    Kill,
    ModelSpec,
    PeerFailed,
    PeerSpec,
    PeerState,
    Policy,
    PoolSpec,
    Reject,
    RejectCode,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    ShutdownRequested,
    Spawn,
    State,
    Stopped,
    Tick,
    check,
    initial_state,
    step,
)

from .profiles import machine_settings


@st.composite
def peer_settings(draw: st.DrawFn) -> Settings:
    limits = draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    models = [
        ModelSpec("a", slots=draw(st.integers(1, 2))),
        ModelSpec("b", gpus=(1,)),
        ModelSpec("p", gpus=(), peer="one"),
        ModelSpec("q", gpus=(), peer="two"),
        ModelSpec("r", gpus=(), peer="one"),
    ]
    pools = [
        PoolSpec("mixed", ("a", "p", "q"), fallback=True),
        PoolSpec("remote", ("q", "r", "b"), fallback=True),
        PoolSpec("first", ("p", "a"), fallback=draw(st.booleans())),
        PoolSpec("peers", ("p", "q"), fallback=True),
    ]
    policy = Policy(queue_limit=draw(st.integers(0, 6)), routing_queue_limit=draw(st.integers(0, 4)))
    peers = [PeerSpec("one", limits[0]), PeerSpec("two", limits[1])]
    return Settings(models=models, pools=pools, peers=peers, policy=policy, devices=[])


TARGETS = ("a", "b", "p", "q", "r", "mixed", "remote", "first", "peers")


class PeerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state: State | None = None
        self.next_rid = 1
        self.now = 0.0
        self.alive: dict[int, str] = {}  # request -> target, until it ends
        self.local_only: set[int] = set()
        self.forwarded: dict[int, tuple[str, str]] = {}  # request -> (peer, model)
        self.dispatched: dict[int, int] = {}  # request -> replica
        self.failed: dict[int, set[str]] = {}  # request -> models whose peer failed it
        self.down: set[str] = set()
        self.loading: set[int] = set()
        self.replicas: set[int] = set()
        self.stopping: set[int] = set()
        self.pending_answer: int | None = None
        self.event: Event | None = None

    @property
    def s(self) -> State:
        assert self.state is not None
        return self.state

    @initialize(settings=peer_settings())
    def setup(self, settings: Settings) -> None:
        self.state = initial_state(settings)

    def feed(self, event: Event) -> tuple[Command, ...]:
        """Step, check the state, and check every command against the environment's account.

        checks: INV-PEER-LIMIT INV-PEER-DOWN INV-HOP INV-PEER-FALLBACK
        """
        self.event = event
        self.state, commands = step(self.s, event)
        check(self.s)
        for command in commands:
            self._account(command)
        rid, self.pending_answer = self.pending_answer, None
        if rid is not None and rid in self.alive:
            waits = self.s.requests[rid].phase == "queued"
            sent = rid in self.forwarded or rid in self.dispatched
            pooled = self.alive[rid] in self.s.settings.pools
            assert waits or sent, f"INV-PEER-FALLBACK: request {rid} a peer failed is in limbo"
            assert pooled, f"INV-PEER-FALLBACK: direct request {rid} a peer failed was not answered at once"
        return commands

    def _account(self, command: Command) -> None:
        settings = self.s.settings
        match command:
            case Forward(rid=rid, peer=peer, model=model):
                assert rid in self.alive and rid not in self.forwarded and rid not in self.dispatched
                assert peer not in self.down, f"INV-PEER-DOWN: forwarded {rid} to {peer}, which is down"
                assert rid not in self.local_only, f"INV-HOP: request {rid} from another router forwarded"
                assert model not in self.failed.get(rid, set()), f"INV-PEER-FALLBACK: {model} again for {rid}"
                assert settings.models[model].peer == peer
                count = sum(1 for p, _ in self.forwarded.values() if p == peer)
                assert count < settings.peer_limit(peer), f"INV-PEER-LIMIT: {peer} has {count} in flight"
                self.forwarded[rid] = (peer, model)
            case Dispatch(rid=rid, replica=replica):
                assert rid in self.alive and rid not in self.forwarded and rid not in self.dispatched
                self.dispatched[rid] = replica
            case Reject(rid=rid, code=code, peer_status=status):
                assert rid in self.alive, f"request {rid} answered twice or never arrived"
                self._answer(rid, code, status)
                self._end(rid)
            case Spawn(replica=replica):
                self.loading.add(replica)
            case Kill(replica=replica):
                self.stopping.add(replica)
            case Stopped() | Tick():
                pass

    def _answer(self, rid: int, code: RejectCode, status: int | None) -> None:
        """checks: INV-HOP INV-PEER-FALLBACK INV-PEER-DOWN"""
        failed = bool(self.failed.get(rid))
        event = self.event
        relayed = code in ("peer_failed", "peer_unreachable") and isinstance(event, PeerFailed)
        expected = event.status if relayed and isinstance(event, PeerFailed) and event.rid == rid else None
        assert status == expected, f"INV-PEER-FALLBACK: {code} for {rid} carries {status}, not {expected}"
        if code == "loop_detected":
            assert rid in self.local_only, f"INV-HOP: request {rid} from a client answered loop_detected"
        elif code in ("peer_failed", "peer_unreachable"):
            assert failed, f"INV-PEER-FALLBACK: request {rid} answered {code}, yet no peer failed it"
            if code == "peer_unreachable":
                event = self.event
                assert isinstance(event, PeerFailed) and event.rid == rid and event.down, (
                    f"INV-PEER-FALLBACK: request {rid} answered peer_unreachable outside its PeerFailed"
                )
        elif code == "model_unavailable":
            assert self.down, f"INV-PEER-DOWN: request {rid} answered model_unavailable with no peer down"
        if failed and code != "shutting_down":
            assert code in ("peer_failed", "peer_unreachable"), (
                f"INV-PEER-FALLBACK: request {rid}, which a peer failed, answered {code}"
            )

    def _end(self, rid: int) -> None:
        self.alive.pop(rid, None)
        self.forwarded.pop(rid, None)
        self.dispatched.pop(rid, None)
        self.local_only.discard(rid)

    # ------------------------------------------------------------------------------------- rules
    @precondition(lambda self: self.state is not None)
    @rule(name=st.sampled_from(TARGETS), local_only=st.booleans())
    def arrive(self, name: str, local_only: bool) -> None:
        rid = self.next_rid
        self.next_rid += 1
        self.alive[rid] = name
        if local_only:
            self.local_only.add(rid)
        self.feed(RequestArrived(rid, name, None, (), local_only))

    @precondition(lambda self: bool(self.forwarded) or bool(self.dispatched))
    @rule(data=st.data(), gone=st.booleans())
    def finish(self, data: st.DataObject, gone: bool) -> None:
        rid = data.draw(st.sampled_from(sorted([*self.forwarded, *self.dispatched])))
        self._end(rid)
        self.feed(ClientGone(rid) if gone else RequestFinished(rid))

    @precondition(lambda self: bool(self.forwarded))
    @rule(data=st.data(), down=st.booleans(), status=st.sampled_from((None, 500, 503)))
    def peer_fails(self, data: st.DataObject, down: bool, status: int | None) -> None:
        rid = data.draw(st.sampled_from(sorted(self.forwarded)))
        peer, model = self.forwarded.pop(rid)
        self.failed.setdefault(rid, set()).add(model)
        if down:
            self.down.add(peer)
        self.pending_answer = rid
        self.feed(PeerFailed(rid, "failed", down=down, status=status))

    @precondition(lambda self: self.state is not None)
    @rule(peer=st.sampled_from(("one", "two")), up=st.booleans())
    def probe(self, peer: str, up: bool) -> None:
        if up:
            self.down.discard(peer)
        else:
            self.down.add(peer)
        self.feed(PeerState(peer, up, "" if up else "no answer"))

    @precondition(lambda self: bool(self.loading))
    @rule(data=st.data())
    def ready(self, data: st.DataObject) -> None:
        replica = data.draw(st.sampled_from(sorted(self.loading)))
        self.loading.discard(replica)
        if replica in self.stopping:
            return
        self.replicas.add(replica)
        self.feed(ReplicaReady(replica))

    @precondition(lambda self: bool(self.stopping - self.loading))
    @rule(data=st.data())
    def exited(self, data: st.DataObject) -> None:
        replica = data.draw(st.sampled_from(sorted(self.stopping - self.loading)))
        self.stopping.discard(replica)
        self.replicas.discard(replica)
        for rid, home in list(self.dispatched.items()):
            if home == replica:
                self.dispatched.pop(rid)
        self.feed(ReplicaExited(replica, "gone"))

    @precondition(lambda self: self.state is not None and not self.s.shutting_down)
    @rule(delay=st.sampled_from((0.0, 5.0)))
    def shutdown(self, delay: float) -> None:
        self.feed(ShutdownRequested(self.now + delay))

    @precondition(lambda self: self.state is not None)
    @rule(delta=st.sampled_from((1.0, 10.0)))
    def tick(self, delta: float) -> None:
        self.now += delta
        self.feed(Tick(self.now))

    # --------------------------------------------------------------------------------- invariants
    @invariant()
    def accounts_agree(self) -> None:
        """checks: INV-PEER-HOME"""
        if self.state is None:
            return
        for peer in ("one", "two"):
            mine = {rid for rid, (p, _) in self.forwarded.items() if p == peer}
            assert set(self.s.peer_inflight.get(peer, ())) == mine, f"INV-PEER-HOME: {peer}"
        assert set(self.s.requests) == set(self.alive), "every request ends exactly once"
        assert set(self.s.peers_down) == self.down


TestPeerMachine = PeerMachine.TestCase
TestPeerMachine.settings = machine_settings(share=4)
