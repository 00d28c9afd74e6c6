"""How requests are turned away: every ``Reject`` carries the code its situation calls for (INV-ANSWER,
INV-ADMISSION), ``model_unavailable`` only when nothing can serve the request (INV-UNSERVABLE), and a request
ends once (INV-CONSERVATION). Each code's HTTP status is router.http.errors' (tests/unit/test_answers.py).
"""

from __future__ import annotations

from statemachine import LoadFailed, Reject, RejectCode, ReplicaExited, SettingsChanged

from .step_base import StepBase
from .views import ORPHANED, WAITING, RequestView, eligible


class AnswerChecks(StepBase):
    """Each ``Reject`` against the answer the environment expects."""

    def reject(self, c: Reject) -> None:
        request = self.w.requests.get(c.rid)
        if request is None:
            if self.arrival is None or c.rid != self.arrival.rid:
                self.fail("INV-CONSERVATION", f"{c} for a request that never arrived")
            return
        if c.peer_status is not None:
            self.fail("INV-ANSWER", f"{c} carries a peer's status, and no peer serves here")
        if request.status == ORPHANED:
            if c.code is not RejectCode.REPLICA_EXITED:
                self.fail("INV-CONSERVATION", f"{c}: a request whose replica exited ends with replica_exited")
            self.end(request, "rejected")
            return
        if request.status != WAITING:
            self.fail("INV-CONSERVATION", f"{c} for a request that is {request.status}")
        if c.code in ("model_unavailable", "queue_full"):
            self.left.append(request)
        if c.code == "model_unavailable" and eligible(self.s, request.target, request.tokens):
            self.unservable(request, c)
        self.end(request, "rejected")
        request.outcome = c.code
        if request is self.arrival:
            self.admission(request, c)
        elif c.code == "queue_full":
            self.fail("INV-ADMISSION", f"{c} for a request that had already been admitted")
        else:
            self.answer(request, c)

    def unservable(self, request: RequestView, c: Reject) -> None:
        """INV-UNSERVABLE: 503 model_unavailable only when no candidate is live and none can get a replica."""
        self.unavailable.append(request)
        names = eligible(self.s, request.target, request.tokens)
        plan = self.w.load_plan(request)
        if plan is not None or any(self.w.live_count(n) for n in names):
            self.fail("INV-UNSERVABLE", f"{c} although {plan or names} could still serve it")

    def answer(self, request: RequestView, c: Reject) -> None:
        """INV-ANSWER: a waiting request is answered with the status and code its situation calls for."""
        e, w = self.event, self.w
        doomed = self.load_failure[1] if self.load_failure is not None else []
        if w.shutting_down:
            expected = RejectCode.SHUTTING_DOWN
        elif (request.rid == self.refused and self.refused_answer(request) == "model_not_found") or (
            isinstance(e, SettingsChanged) and request.rid in self.vanished
        ):
            expected = RejectCode.MODEL_NOT_FOUND
        elif request.rid in doomed:
            expected = RejectCode.LOAD_FAILED
            assert self.load_failure is not None
            reason = e.reason if isinstance(e, LoadFailed | ReplicaExited) else ""
            if self.load_failure[0] not in c.message or reason not in c.message:
                self.fail("INV-ANSWER", f"{c} does not name {self.load_failure[0]} and the reason {reason!r}")
        else:
            expected = RejectCode.MODEL_UNAVAILABLE
        if c.code is not expected:
            self.fail("INV-ANSWER", f"{c} after {e}, expected {expected}")

    def admission(self, request: RequestView, c: Reject) -> None:
        s, w = self.s, self.w
        names = eligible(s, request.target, request.tokens)
        if w.shutting_down:
            expected: RejectCode | None = RejectCode.SHUTTING_DOWN
        elif request.target not in s.models and request.target not in s.pools:
            expected = RejectCode.MODEL_NOT_FOUND
        elif not names:
            pool = s.pools.get(request.target)
            members = (
                [request.target] if pool is None else (pool.members if pool.fallback else pool.members[:1])
            )
            specs = [s.models[m] for m in members]
            if all(m.refusal is not None for m in specs):
                expected = RejectCode.MODEL_UNAVAILABLE
            else:
                expected = RejectCode.CONTEXT_LENGTH_EXCEEDED
                largest = max(m.ctx_per_slot or 0 for m in specs if m.refusal is None)
                if str(request.tokens) not in c.message or str(largest) not in c.message:
                    self.fail("INV-ADMISSION", f"{c} does not name {request.tokens} and {largest} tokens")
        else:
            expected = None
        if expected is not None:
            if c.code is not expected:
                self.fail("INV-ADMISSION", f"{c}, expected {expected}")
        elif c.code == "queue_full":
            if not self.arrival_over_limit:
                self.fail("INV-ADMISSION", f"{c} although the queue had room")
        elif c.code != "model_unavailable":
            self.fail("INV-ADMISSION", f"{c} for a servable request")
