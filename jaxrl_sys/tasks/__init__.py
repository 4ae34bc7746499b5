"""jaxrl_sys.tasks."""
