"""jaxrl_sys.sharding."""
