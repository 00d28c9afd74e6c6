"""Hypothesis profiles for the scheduler's property tests, chosen with ``HYPOTHESIS_PROFILE``.

- ``ci`` (the default): the main machine runs 1000 examples of up to 50 steps, the liveness machine a quarter
  of that;
- ``thorough``: ten times as many;
- ``mutation``: derandomized, no shrinking, 300 examples (for scripts/mutate_statemachine.py).

The profiles are only registered here, not loaded globally, so other test suites in the same run keep their
own settings; the machines read the chosen profile through ``property_tests.profiles.machine_settings``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

_COMMON = {
    "deadline": None,
    "stateful_step_count": 50,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}

settings.register_profile("ci", max_examples=1000, **_COMMON)
settings.register_profile("thorough", max_examples=10_000, **_COMMON)
# For scripts/mutate_statemachine.py: the same examples every run, no shrinking (a failure is all it needs).
settings.register_profile(
    "mutation",
    max_examples=300,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    **_COMMON,
)
