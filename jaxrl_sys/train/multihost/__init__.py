"""Process-group plumbing of a run over several JAX processes (below the loop, above the step).

`job`: joining a multi-process job (`DistributedConfig`, `initialize`, the liveness `Watchdog`,
cluster detection); `collectives`: process 0, barriers and collectives, each process's block
of a mesh and of a batch. The loop's use of them (each process building its own rows of a
step) is `train.loop.process_group`. (Not named `dist/`: tools and the usual Python
.gitignore take a `dist/` folder for packaging output.)
"""
