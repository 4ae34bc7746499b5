"""Run directories, config files, input validation and the progress display (no training)."""
import io
import json
import os

import pytest

from jaxrl_sys.train.recipe import config_file
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.recipe import run_dir
from jaxrl_sys.train.loop.metrics_log import Progress
from tests.train.common import quick


def test_new_run_dir_never_reuses(tmp_path):
  a = run_dir.new_run_dir(str(tmp_path), "grpo-x")
  os.makedirs(a)
  b = run_dir.new_run_dir(str(tmp_path), "grpo-x")
  assert a != b and not os.path.exists(b)


def test_prepare_refuses_a_previous_run_then_overwrites_only_run_outputs(tmp_path):
  d = tmp_path / "run"
  os.makedirs(d / "tb")
  (d / "tb" / "events").write_text("x")
  os.makedirs(d / "checkpoints")  # empty (a run that stopped before its first save): no output
  (d / "metrics.jsonl").write_text('{"step": 1}\n')
  (d / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match=r"already holds a run \(metrics.jsonl, tb\).*--overwrite"):
    run_dir.prepare_run_dir(str(d))
  assert run_dir.prepare_run_dir(str(d), resume=True) == str(d)
  assert (d / "metrics.jsonl").exists()  # a resumed run continues its metrics
  run_dir.prepare_run_dir(str(d), overwrite=True)
  assert sorted(os.listdir(d)) == ["notes.txt"]


@pytest.mark.parametrize("flag", ["out_dir", "checkpoint_dir", "export_hf"])
def test_output_path_that_is_a_file(tmp_path, flag):
  f = tmp_path / "afile"
  f.write_text("x")
  with pytest.raises(ValueError, match=f"--{flag}=.*afile is a file"):
    recipe_lib.build_recipe(quick(**{flag: str(f)}))
  with pytest.raises(ValueError, match="is a file, so the directory cannot be created"):
    recipe_lib.build_recipe(quick(**{flag: str(f / "sub")}))


@pytest.mark.parametrize("kw,message", [
    (dict(steps=0), "loop.steps=0: nothing to train"),
    (dict(sft_steps=-5), "warmup.steps=-5 must be >= 0"),
    (dict(eval_every=-1), "eval.every=-1 must be >= 0"),
    (dict(learning_rate=0.0), "optim.learning_rate=0.0 must be > 0"),
    (dict(task="arithmetic", reward="m:f"), "--reward applies to data-set tasks"),
    (dict(model="tiny_moe", export_hf="/tmp/x"), "the tiny MoE preset has no Hugging Face"),
])
def test_numbers_and_combinations_are_checked(kw, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(")):
    recipe_lib.build_recipe(quick(**kw))


def test_countdown_gets_its_own_defaults():
  """--task=countdown alone: no arithmetic arguments, and lengths that fit its problems."""
  recipe = recipe_lib.build_recipe(quick(task="countdown"))
  rc, tok = recipe.config.loop, recipe.model.tokenizer
  assert recipe.config.task.args == ""
  for i in range(200):
    p = recipe.task.problem(i)
    assert len(tok.encode(p.prompt, bos=True)) <= rc.max_prompt_len
    assert len(tok.encode(p.answer, eos=True)) <= rc.max_new_tokens
  assert recipe.model.config.max_seq_len == rc.max_prompt_len + rc.max_new_tokens


def test_config_file_keys_are_checked(tmp_path):
  p = tmp_path / "c.yaml"
  p.write_text("steps: 2\nlearning_rat: 0.1\n")
  data = config_file.read_config_file(str(p))
  assert data == {"steps": 2, "learning_rat": 0.1}
  with pytest.raises(ValueError, match="unknown key.*'learning_rat' \\(did you mean "
                                       "'learning_rate'\\?\\)"):
    config_file.check_keys(data, [f for f in recipe_lib.RecipeConfig.__dataclass_fields__], "c")
  (tmp_path / "bad.json").write_text("[1, 2]")
  with pytest.raises(ValueError, match="expected a mapping"):
    config_file.read_config_file(str(tmp_path / "bad.json"))


def test_reproducible_config_has_no_locations():
  out = config_file.reproducible(vars(quick(out_dir="x", checkpoint_dir="y", export_hf="z")))
  assert not set(config_file.LOCATION_KEYS) & set(out)
  assert json.loads(json.dumps(out))["steps"] == 3


def test_progress_shows_at_once_and_prints_messages():
  s = io.StringIO()
  p = Progress(5, True, stream=s)
  assert "starting" in s.getvalue() and "0/5" in s.getvalue()  # before any step
  p.phase("compiling...")
  p.message("run directory: /x")
  p.update(2, {"reward_mean": 0.5, "kl": 0.01, "time_step": 0.1}, newline=True)
  p.close()
  text = s.getvalue()
  assert "compiling..." in text and "run directory: /x\n" in text
  assert "step 2/5 reward 0.500" in text
  quiet = io.StringIO()
  q = Progress(5, False, stream=quiet, messages=True)
  q.message("resumed from step 3")
  q.update(1, {})
  q.close()
  assert quiet.getvalue() == "resumed from step 3\n"


def test_run_refuses_an_external_checkpoint_dir_held_by_a_live_run(tmp_path):
  """The recipe takes the external --checkpoint_dir's lock with the run directory's, before any
  work; the refused run leaves neither lock behind."""
  from jaxrl_sys.train.recipe import run_lock  # pylint: disable=import-outside-toplevel
  ckpt = tmp_path / "shared_ckpts"
  os.makedirs(ckpt)
  other = run_lock.RunLock(str(ckpt))  # stands for the first run's lock, alive (this pid)
  other.acquire(flag="--checkpoint_dir")
  recipe = recipe_lib.build_recipe(quick(out_dir=str(tmp_path / "run_b"),
                                         checkpoint_dir=str(ckpt)))
  with pytest.raises(run_lock.RunDirLockedError, match="--checkpoint_dir=.*shared_ckpts is in use"):
    recipe_lib.run_recipe(recipe, messages=False)
  assert not (tmp_path / "run_b" / run_lock.LOCK_NAME).exists()
  other.release()
