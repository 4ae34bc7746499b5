"""The side-by-side comparison with TRL and Tunix (`python -m benchmarks.peers.compare`): the
driver, the peers' benchmark scripts (run in their own environments) and their pinned versions."""
