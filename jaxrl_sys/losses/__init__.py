"""jaxrl_sys.losses."""
