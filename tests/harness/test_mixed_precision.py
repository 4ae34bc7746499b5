"""A bfloat16 Hugging Face checkpoint through the recipe with a bfloat16 rollout: published
weights are the float32 masters cast, mismatch metrics are logged, final_params.npz is plain
numbers, the export is float32 by default (a bfloat16 one would drop most of the update: the
survival count says so), and a resume is bit-exact."""
import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.models import load_hf_checkpoint, update_survival
from jaxrl_sys.models.hf import safetensors_io
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.recipe import build as recipe_build
from tests.train.common import bf16_hf_dir, quick

REWARD = "def length(prompt, completion, **row):\n  return len(completion) / 10\n"
SUMS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "sums.jsonl"


class _Recorded(recipe_build.RLLoop):
  """The recipe's loop, kept for the test to read its rollout client afterwards."""
  last = None

  def __init__(self, *a, **kw):
    super().__init__(*a, **kw)
    _Recorded.last = self


def _flat(params):
  return {"/".join(str(getattr(k, "key", k)) for k in kp): np.asarray(v)
          for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_bf16_checkpoint_with_bf16_rollout(tmp_path, monkeypatch):
  d = bf16_hf_dir(tmp_path / "m")
  (tmp_path / "reward.py").write_text(REWARD)
  base = quick(model=d, task=f"jsonl:{SUMS}",
               reward=f"{tmp_path / 'reward.py'}:length", learning_rate=1e-6, kl_coef=0.0,
               rollout_dtype="bfloat16", steps=3, prompts_per_step=4, max_new_tokens=4)
  monkeypatch.setattr(recipe_build, "RLLoop", _Recorded)
  rc = dataclasses.replace(base, out_dir=str(tmp_path / "a"), export_hf=str(tmp_path / "hf"))
  recipe = recipe_lib.build_recipe(rc)
  precision = recipe.config.precision
  assert (precision.param_dtype, precision.compute_dtype, precision.rollout_dtype) == (
      "float32", "float32", "bfloat16")
  result = recipe_lib.run_recipe(recipe, messages=False)
  loop = _Recorded.last
  masters = result.run.state.params
  assert {x.dtype for x in jax.tree.leaves(masters)} == {jnp.dtype(jnp.float32)}

  # The weights the rollout engines got: the final masters cast to bfloat16, bit for bit.
  published, _ = loop.client.store.published(loop.client.fleet.latest).load()
  want = jax.tree.map(lambda p: np.asarray(p).astype(jnp.bfloat16), masters)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(
      np.asarray(a).view(np.uint16), b.view(np.uint16)), published, want)
  assert (loop.plan.rollout_model.compute_dtype, loop.plan.train_model.param_dtype) == (
      "bfloat16", "float32")

  # Mismatch metrics per step; bf16 rollout vs fp32 training differ a little on every step.
  rows = [json.loads(line) for line in open(tmp_path / "a" / "metrics.jsonl")]
  assert len(rows) == 3
  for row in rows:
    assert 0 < row["mismatch_mean"] <= row["mismatch_max"], row
    assert 0 <= row["mismatch_out_frac"] <= 1
  config = json.load(open(tmp_path / "a" / "config.json"))["precision"]
  assert (config["param_dtype"], config["compute_dtype"], config["rollout_dtype"]) == (
      "float32", "float32", "bfloat16")
  assert config["export_dtype"] == "float32"  # keeps the update (issue 44)

  # final_params.npz: plain float32 numbers for numpy, equal to the masters.
  with np.load(tmp_path / "a" / "final_params.npz", allow_pickle=False) as npz:
    saved = dict(npz)
  ours = _flat(masters)
  assert saved.keys() == ours.keys()
  for k, v in saved.items():
    assert v.dtype == np.float32, (k, v.dtype)
    np.testing.assert_array_equal(v, ours[k], err_msg=k)

  # --export_hf writes float32 by default: the masters exactly, which transformers loads; the
  # run's note counts what the export keeps. The checkpoint's bfloat16 would keep a few percent
  # of this lr-1e-6 update (the rest rounds back to the input weights).
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  hf = str(tmp_path / "hf")
  assert {v.dtype for v in safetensors_io.read_checkpoint(hf).values()} == {np.dtype(np.float32)}
  tm = transformers.AutoModelForCausalLM.from_pretrained(hf)
  assert next(tm.parameters()).dtype == torch.float32
  _, back = load_hf_checkpoint(hf, dtype=None)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), back,
               masters)
  initial = recipe.model.params
  moved = sum(int(np.sum(np.asarray(a) != np.asarray(b)))
              for a, b in zip(jax.tree.leaves(initial), jax.tree.leaves(masters)))
  note = next(n for n in result.notes if n.startswith("--export_hf:"))
  assert f"float32 export keeps the update of {moved:,} of the {moved:,} parameters" in note
  bf16 = update_survival(initial, masters, jnp.bfloat16)
  kept = sum(int(np.sum(np.asarray(a).astype(jnp.bfloat16) != np.asarray(b).astype(jnp.bfloat16)))
             for a, b in zip(jax.tree.leaves(initial), jax.tree.leaves(masters)))
  assert (bf16.changed, bf16.kept) == (moved, kept) and 0 < kept < 0.5 * moved
  assert bf16.describe().startswith("WARNING: bfloat16 export keeps the update of")

  # Resume from a mixed-precision checkpoint: bit-exact with the undisturbed run above.
  part = dataclasses.replace(base, out_dir=str(tmp_path / "b"), steps=2)
  recipe_lib.run_recipe(recipe_lib.build_recipe(part), messages=False)
  rest = dataclasses.replace(base, out_dir=str(tmp_path / "b"))
  resumed = recipe_lib.run_recipe(recipe_lib.build_recipe(rest), resume=True, messages=False)
  assert resumed.run.resumed_from == 2
  with np.load(tmp_path / "b" / "final_params.npz") as npz:
    for k, v in npz.items():
      np.testing.assert_array_equal(v, saved[k], err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               resumed.run.state.opt_state, result.run.state.opt_state)
  assert os.path.exists(tmp_path / "b" / "checkpoints")
