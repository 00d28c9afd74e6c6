"""Priority classes: who is served first when several requests could use a free slot.

A request's class comes from its client's key (``[keys.NAME] class``), lowered by the request itself when
it asks (never raised). The scheduler orders waiting requests by class first; a request that has waited its
class's maximum wait (``Policy.max_wait``) goes before every class, oldest first, so no class starves.
"""

from __future__ import annotations

import enum


class RequestClass(enum.IntEnum):
    """Lower is served first."""

    INTERACTIVE = 0  # a person waiting on the answer
    STANDARD = 1  # the default: agents, scripts, anything unnamed
    BATCH = 2  # evals, corpus embedding: whatever can wait

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def named(cls, text: str) -> RequestClass | None:
        """The class called ``text`` (``interactive``, ``standard``, ``batch``), or None."""
        return _BY_LABEL.get(text)


_BY_LABEL = {member.label: member for member in RequestClass}
