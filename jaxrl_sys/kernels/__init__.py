"""jaxrl_sys.kernels."""
