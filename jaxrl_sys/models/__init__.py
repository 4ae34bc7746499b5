"""jaxrl_sys.models."""
