"""The host RL loop: everything with side effects between a rollout and a train step.

`rl_loop.RLLoop` (prompts -> rollout -> rewards -> advantages -> step -> publish -> checkpoint),
`buffer` (in-flight groups), `groups` (requests and scoring), `guard` (divergence),
`checkpoint` / `compat` (orbax saves and resume checks), `metrics_log` (metrics, progress,
plots), `evaluate` / `periodic_eval` (held-out rewards) and `supervised` (the warm-up).
"""
