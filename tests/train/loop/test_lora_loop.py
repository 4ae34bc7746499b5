"""LoRA through the RL loop a user runs (`run_recipe`), one run covering the loop's paths: an
MoE policy with adapters on attention and the routed experts, the async loop (rollout one
version ahead), routing replay of the engine's routes (R3, computed by the base router: the
router is never adapted); a real SIGTERM mid-run, then `--resume`, ends bit for bit where an
uninterrupted run does (the checkpoints hold the adapters only, the base is read back from the
file the fresh run wrote); a resume onto another base is refused; the published bytes per step
are the adapters'. Gradients against merged weights: `tests/train/step/test_lora_step.py`."""
import os
import signal
import threading
import time

import numpy as np
import pytest

from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.loop.compat import CheckpointMismatchError
from jaxrl_sys.train.recipe.run import LORA_BASE_FILE
from jaxrl_sys.train.recipe.run_dir import load_tree, save_tree
from tests.train.common import quick

LORA = {"lora.rank": 4, "lora.alpha": 8.0}


def _config(**kw):
  flat = {k: v for k, v in kw.items() if "." not in k}
  dotted = {k: v for k, v in kw.items() if "." in k}
  return quick(**flat).run_config().replace(**LORA, **dotted)


def _params(out_dir):
  with np.load(os.path.join(out_dir, "final_params.npz")) as z:
    return {k: z[k] for k in z.files}


def _sigterm_when(pred, timeout=300.0):
  """Sends this process a SIGTERM once `pred()` holds (a watcher thread: a real signal, which
  the loop's handler turns into 'finish the step, save, stop')."""
  def watch():
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
      if pred():
        os.kill(os.getpid(), signal.SIGTERM)
        return
      time.sleep(0.01)
  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread


def _steps(ck):
  return sorted(int(d) for d in os.listdir(ck) if d.isdigit()) if os.path.isdir(ck) else []


def test_moe_async_sigterm_then_resume_is_bit_exact_and_another_base_is_refused(tmp_path):
  steps = dict(steps=4, save_every=1, model="tiny_moe", mode="async", max_staleness=1,
               **{"lora.targets": "attention,experts"})
  ref = recipe_lib.run_recipe(recipe_lib.build_recipe(_config(**steps,
                                                              out_dir=str(tmp_path / "ref")))).run
  adapters = lora_lib.nbytes((ref.state.params, ref.state.moe_state))  # + the routing biases
  assert all(h["publish_bytes"] == adapters for h in ref.history)
  assert ref.state.base is not None and "moe" in ref.state.params["layers"]
  assert max(h["staleness_mean"] for h in ref.history) > 0  # the async loop ran ahead
  # The engine's routes (its adapted attention feeding the base router) replayed in training.
  assert all(h["route_bytes"] > 0 and 0.5 < h["moe/replay_agreement_mean"] <= 1.0
             for h in ref.history)
  assert all(np.isfinite(h["loss"]) and np.isfinite(h["grad_norm"]) for h in ref.history)
  out = str(tmp_path / "run")
  ck = os.path.join(out, "checkpoints")
  watcher = _sigterm_when(lambda: bool(_steps(ck)))
  cut = recipe_lib.run_recipe(recipe_lib.build_recipe(_config(**steps, out_dir=out))).run
  watcher.join()
  assert cut.preempted and cut.stop_signal == "SIGTERM" and len(cut.history) < 4
  assert os.path.exists(os.path.join(ck, LORA_BASE_FILE))  # the base the run made, written once
  again = recipe_lib.run_recipe(recipe_lib.build_recipe(_config(**steps, out_dir=out)),
                                resume=True).run
  assert again.resumed_from == len(cut.history) and not again.preempted
  a, b = _params(tmp_path / "ref"), _params(out)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(b[k], a[k], err_msg=k)
  # The base changed on disk (another model under the same name): the adapters are refused.
  base = load_tree(os.path.join(ck, LORA_BASE_FILE))
  base["embed"] = base["embed"] + 1
  save_tree(os.path.join(ck, LORA_BASE_FILE), base)
  with pytest.raises(CheckpointMismatchError, match="LoRA adapters trained on another base"):
    recipe_lib.run_recipe(recipe_lib.build_recipe(_config(**dict(steps, steps=6), out_dir=out)),
                          resume=True)

