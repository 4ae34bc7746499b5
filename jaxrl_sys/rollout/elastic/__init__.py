"""Elastic rollout (numpy only): the worker `fleet`, the `offload` controller, preemption
`schedules` and spot `traces`."""
