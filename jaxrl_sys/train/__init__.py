"""jaxrl_sys.train."""
