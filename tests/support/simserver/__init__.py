"""A simulated llama-server: a real HTTP server process whose loading, slots, speed and failures a test
chooses (see ``Behaviour``). Run it as ``python -m tests.support.simserver --port N -m MODEL ...`` from the
repository root, or through the launcher ``tests.support.simtools.sim_launcher`` writes."""

from tests.support.simserver.server import BEHAVIOUR_KEYS, SIDECAR_SUFFIX, Behaviour, main

__all__ = ["BEHAVIOUR_KEYS", "SIDECAR_SUFFIX", "Behaviour", "main"]
