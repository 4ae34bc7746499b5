"""jaxrl_sys.sim."""
