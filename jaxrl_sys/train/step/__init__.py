"""The pure train step: state, optimizer, batches and the jitted GRPO-family update.

Nothing here has side effects: `update.train_step(state, batch) -> (state, metrics)` and the
functions it is made of, jitted on a mesh by `update.make_train_fns` (once per process for
equal configurations: `programs.train_programs`); `state.TrainState`;
`optim.make_optimizer`; `batch.pack` (completions -> fixed-shape arrays); `config.TrainConfig`
and `config.OptimConfig` (static, part of the compile key).
"""
