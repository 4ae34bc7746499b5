"""jaxrl_sys.rollout."""
