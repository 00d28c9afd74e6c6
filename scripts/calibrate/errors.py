"""How a calibration run fails: the machine cannot run it (exit status 2) or the run broke (exit status 1)."""

from __future__ import annotations


class Unavailable(RuntimeError):
    """This machine cannot run the calibration (exit status 2)."""


class RunFailed(RuntimeError):
    """The calibration started but could not finish (exit status 1)."""
