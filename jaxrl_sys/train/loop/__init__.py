"""The host RL loop: everything with side effects between a rollout and a train step.

`rl_loop.RLLoop` (prompts -> rollout -> rewards -> advantages -> step -> publish -> checkpoint),
`plan` (`RunPlan`: the run's arithmetic, computed once), `local_step` / `process_group` (one train
step in one process, or this process's rows of it over several), `buffer` (in-flight groups),
`groups` (requests and scoring), `guard` (divergence), `checkpoint` / `compat` (orbax saves and
resume checks), `resume` (restoring for `--resume`, the loop's host state), `publish` (a state's
weights to the rollout session), `metrics_log` (metrics, progress, plots), `collapse` (the
policy-collapse note), `evaluate` / `periodic_eval` (held-out rewards), `supervised` (the
warm-up), `step_stats` (a step's host-side rollout statistics) and `stop_signals` (SIGTERM /
SIGINT). The loop is handed its rollout session (`rollout.types.RolloutSession`) and never builds
one.
"""
