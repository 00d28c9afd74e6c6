"""The one exception the scheduler raises."""


class IllegalEvent(Exception):
    """An event that cannot happen in the current state.

    The state passed to ``step()`` is never modified, so the caller still holds the state from before the
    event; the message says which rule the event broke.
    """
