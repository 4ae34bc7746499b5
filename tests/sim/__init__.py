"""Tests of jaxrl_sys.sim."""
