"""The Hypothesis settings of the machines: the profile named by ``HYPOTHESIS_PROFILE`` (default ``ci``).

The profiles themselves are registered in property_tests/conftest.py.
"""

from __future__ import annotations

import os

from hypothesis import settings


def profile_name() -> str:
    return os.environ.get("HYPOTHESIS_PROFILE", "ci")


def machine_settings(share: int = 1) -> settings:
    """The chosen profile, with ``1/share`` of its examples (at least 20)."""
    base = settings.get_profile(profile_name())
    return settings(base, max_examples=max(20, base.max_examples // share))
