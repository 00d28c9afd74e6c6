"""What the test tiers share: routers to start, simulated and real llama-servers, stand-ins."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
