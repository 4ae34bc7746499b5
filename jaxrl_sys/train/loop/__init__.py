"""The host RL loop: everything with side effects between a rollout and a train step.

`rl_loop.RLLoop` (prompts -> rollout -> rewards -> advantages -> step -> publish -> checkpoint),
`buffer` (in-flight groups), `groups` (requests and scoring), `guard` (divergence),
`checkpoint` / `compat` (orbax saves and resume checks), `metrics_log` (metrics, progress,
plots), `collapse` (the policy-collapse note), `evaluate` / `periodic_eval` (held-out rewards), `supervised` (the warm-up),
`distributed` (joining a multi-process JAX job, the liveness watchdog), `multihost` (each
process's rows of a batch, the per-step collectives) and `step_stats` (a step's host-side
rollout statistics).
"""
