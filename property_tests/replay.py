"""Turn a failing run into Python that reproduces it: the settings and the plain list of events.

Paste the printed snippet into a file or a REPL at the repository root; it calls ``statemachine.run`` and
checks every state on the way, so the failure shows again without Hypothesis.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from statemachine import Event, Settings

# An enum member's repr (``<RequestClass.BATCH: 2>``) is not Python; its qualified name is.
_MEMBER = re.compile(r"<(\w+\.\w+): [^>]*>")

_HEADER = """\
from pyrsistent import pmap
from statemachine import *
from statemachine import check, initial_state, step

"""

_FOOTER = """
state = initial_state(settings)
for number, event in enumerate(events):
    state, commands = step(state, event)
    print(number, event, '->', list(commands))
    check(state)
"""


def replay_code(settings: Settings, events: Sequence[Event]) -> str:
    lines = [_HEADER, f"settings = {_code(settings)}", "events = ["]
    lines.extend(f"    {_code(event)}," for event in events)
    lines.append("]")
    return "\n".join(lines) + "\n" + _FOOTER


def _code(value: object) -> str:
    return _MEMBER.sub(r"\1", repr(value))


def replay_banner(settings: Settings, events: Sequence[Event]) -> str:
    return "\n---- replay: paste this to reproduce ----\n" + replay_code(settings, events) + "---- end ----"
