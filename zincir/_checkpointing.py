"""The checkpoints of :class:`~zincir._run.Run`: a candidate state stored before its verifier
runs, then the verifier's decision recorded, so that a crash in between leaves the candidate to
be verified again (docs/checkpoints.md).

A base class of :class:`~zincir._run.Run`, kept apart because it is its own concern; it declares
the attributes it uses, and the few methods of the run it calls, for type checking.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import CheckpointNotPending, InvalidArgument
from ._run_support import _RunCore
from ._types import Checkpoint, CheckpointState, Verification, Verifier
from ._validation import check_async_callable, check_call_id


class _Checkpointing(_RunCore):
    """What a run's checkpoints need: :class:`~zincir._run.Run` inherits it (see the module's
    docstring and :class:`~zincir._run_support._RunCore`)."""

    async def checkpoint(
        self, call_id: str, state: CheckpointState | Mapping[str, Any], verify: Verifier
    ) -> Checkpoint:
        """Propose ``state`` for the pending ``submit_checkpoint`` intent ``call_id``, have
        ``verify`` judge it, and record the decision. Returns the decided checkpoint.

        The candidate is stored before ``verify`` runs, so a crash exposes it again through
        :meth:`pending_checkpoint`. ``verify`` runs outside any database lock while the
        heartbeat keeps the lease; its exception propagates and leaves the candidate undecided.
        """
        check_call_id(call_id, f"run {self.id}: call_id")
        check_async_callable(verify, f"run {self.id}: the verifier")
        if not isinstance(state, CheckpointState):
            state = CheckpointState.from_json(state)
        state_json = self._encode(state.to_json(), f"checkpoint state for {call_id!r}")
        candidate = await self._write(self._store.propose_checkpoint, call_id, state_json)
        return await self._decide(candidate, verify)

    async def pending_checkpoint(self) -> Checkpoint | None:
        """The undecided candidate a crash left behind, if any."""
        result: Checkpoint | None = await self._read(self._store.candidate, None)
        return result

    async def verify_checkpoint(self, candidate: Checkpoint, verify: Verifier) -> Checkpoint:
        """Verify and decide an undecided candidate. The *stored* candidate is verified: the
        fields of ``candidate`` other than its id are ignored."""
        if not isinstance(candidate, Checkpoint):
            raise InvalidArgument(f"run {self.id}: verify_checkpoint() takes a Checkpoint, not {candidate!r}")
        check_async_callable(verify, f"run {self.id}: the verifier")
        stored = await self._read(self._store.candidate, candidate.id)
        if stored is None:
            raise CheckpointNotPending(
                f"run {self.id}: checkpoint {candidate.id} is not an undecided candidate"
            )
        return await self._decide(stored, verify)

    async def _decide(self, candidate: Checkpoint, verify: Verifier) -> Checkpoint:
        if self._trace is None:
            return await self._verify_and_decide(candidate, verify)
        with self._trace.checkpoint(candidate.id, candidate.round, candidate.state.to_json()) as span:
            decided = await self._verify_and_decide(candidate, verify)
            span.set_attribute("zincir.checkpoint.passed", decided.status == "accepted")
            span.set_attribute("zincir.seq", decided.decision_event_seq)
            return decided

    async def _verify_and_decide(self, candidate: Checkpoint, verify: Verifier) -> Checkpoint:
        verification = await verify(candidate.state)
        if not isinstance(verification, Verification) or not isinstance(verification.passed, bool):
            raise InvalidArgument(
                f"run {self.id}: a verifier must return a Verification whose passed is a bool,"
                f" not {verification!r}; the candidate stays undecided"
            )
        self._check_usable()  # the lease may have been lost while the verifier ran
        verdict = self._encode(
            {"evidence": verification.evidence, "passed": verification.passed}, "verification evidence"
        )
        decided: Checkpoint = await self._write(
            self._store.decide_checkpoint, candidate.id, verdict, verification.passed
        )
        return decided
