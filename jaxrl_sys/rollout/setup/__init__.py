"""Where rollout runs and the clients that run it, built in one place.

`spec` (numpy only): `RolloutSetup`, the `rollout` section of a run's config, and
`ClientOptions` (what the run derives: local engine count, warm-up, seed, compile cache).
`factory.make_client(setup, model_config, engine_config, options=..., clock=...)`: every rollout
client by name (`local`, `thread`, `ray`), from `local` (in-process engines) and `ray` (Ray
workers under a fleet). Importing this package imports none of them.
"""
