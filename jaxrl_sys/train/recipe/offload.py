"""Adaptive rollout offload (RLBoost seeding) attached to a run as hooks, not loop code.

`OffloadHooks` drives an `rollout.elastic.offload.OffloadDriver` over the run's rollout session
from two places the recipe wires up:

- a tick hook (`session.add_tick_hook`), run at every scheduling round while the loop polls:
  at the step's first round the trainer's engines take work and the fleet cap becomes N_prem
  (`begin_step`); when the seeding window T_seed has passed they hand their unfinished
  requests to the remote workers (`hand_off`); if every remote worker is gone the trainer's
  engines take the work back;
- a step hook (`RLLoop(step_hooks=...)`), run after each step: the step is measured, the
  controller updated and its metrics added to the row (`end_step`); a step whose groups
  completed within the window hands off there.

The trainer's wait for responses after seeding is the step's rollout time less the window (the
loop polls throughout the window). The controller's state is checkpointed with the run
(`state_dict` / `load_state_dict`, key "offload").
"""
from __future__ import annotations

from typing import Any

from jaxrl_sys.rollout.clock import Clock
from jaxrl_sys.rollout.elastic.offload import OffloadConfig, OffloadDriver, OffloadState
from jaxrl_sys.rollout.types import RolloutSession

KEY = "offload"  # its part of the checkpointed host state


class OffloadHooks:
  """The offload controller of one run (see the module docstring).

  Args:
    config: the controller's settings.
    session: the training rollout session (a manager with local and remote workers).
    clock: the session's clock.
  """

  def __init__(self, config: OffloadConfig, session: RolloutSession, clock: Clock):
    self.config, self.session, self.clock = config, session, clock
    self.driver = OffloadDriver(config)
    self._begin = True      # the next scheduling round starts a step's seeding window
    self._window = 0.0      # seconds the step seeded before handing off

  def attach(self) -> None:
    """Installs the tick hook and applies the cap (before the fleet starts any worker)."""
    self.session.add_tick_hook(self.tick)
    self.driver.apply_cap(self.session)

  # ----- checkpointed state ------------------------------------------------------------------
  def state_dict(self) -> dict:
    return self.driver.state.to_json()

  def load_state_dict(self, state: dict | None) -> None:
    """Restores the controller (None: a fresh run keeps its first window) and its cap."""
    if state is not None:
      self.driver = OffloadDriver(self.config, OffloadState.from_json(state))
    self.driver.apply_cap(self.session)

  # ----- hooks -------------------------------------------------------------------------------
  def tick(self, manager: Any, now: float) -> None:
    """The tick hook: starts the window at a step's first round, hands off when it ends."""
    driver = self.driver
    if self._begin:
      self._begin, self._window = False, 0.0
      driver.begin_step(manager)
    deadline = driver.deadline()
    if deadline is not None and now >= deadline:
      self._window = now - (deadline - driver.state.t_seed)
      driver.hand_off(manager)
    driver(manager, now)

  def __call__(self, step: int, state: Any, row: dict) -> None:  # pylint: disable=unused-argument
    """The step hook: ends the step's window, measures the step, updates the controller."""
    driver = self.driver
    if self._begin:  # no scheduling round ran this step (its groups were complete already)
      self._begin = False
      driver.begin_step(self.session)
    t_roll, t_train = row["time_rollout"], row["time_train"]
    if driver.deadline() is not None:  # the step's groups completed within the window
      self._window = t_roll
      driver.hand_off(self.session)
    row.update(driver.end_step(self.session, max(t_roll - self._window, 0.0), t_train))
    self._begin = True
