"""What the test tiers share: routers to start, simulated and real llama-servers, stand-ins."""
