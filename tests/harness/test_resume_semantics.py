"""Resume semantics (issue 30): each call's changed settings are recorded, replayed steps
replace their rows, --steps below the run's step and all-unreadable checkpoints are errors,
--resume --overwrite and a non-empty --export_hf are refused before any work."""
import json
import os
import shutil

import pytest

from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.loop.rl_loop import UnreadableCheckpointsError
from tests.train.common import quick


def _run(resume=False, **kw):
  return recipe_lib.run_recipe(recipe_lib.build_recipe(quick(**kw)), resume=resume)


def _steps(out):
  return [json.loads(line)["step"] for line in open(os.path.join(out, "metrics.jsonl"))]


def _config(out):
  return json.load(open(os.path.join(out, "config.json")))


def test_resume_semantics(tmp_path, capsys):
  out = str(tmp_path / "run")
  ck = os.path.join(out, "checkpoints")
  _run(steps=3, out_dir=out)
  assert _steps(out) == [1, 2, 3] and not os.path.exists(os.path.join(out, ".lock"))
  # SIGKILL while step 3 was being saved: its row is logged, its checkpoint is not committed
  shutil.rmtree(os.path.join(ck, "3"))
  capsys.readouterr()
  result = _run(resume=True, steps=4, learning_rate=2e-3, out_dir=out)
  err = capsys.readouterr().err
  assert result.run.resumed_from == 2
  assert _steps(out) == [1, 2, 3, 4]  # step 3 replayed: one row, the new one
  assert "settings changed since the previous call: loop.steps 3 -> 4, optim.learning_rate " \
      "0.001 -> 0.002" in err
  cfg = _config(out)
  assert cfg["optim"]["learning_rate"] == 0.002 and cfg["loop"]["steps"] == 4
  first, second = cfg["history"]
  assert first["call"] == 1 and not first["resume"] and "changed" not in first
  assert second["call"] == 2 and second["resume"]
  assert second["changed"] == {"optim.learning_rate": [0.001, 0.002], "loop.steps": [3, 4]}
  # the file still feeds --config (history is not a setting)
  from jaxrl_sys.train.recipe import config_file
  assert "history" not in config_file.read_config_file(os.path.join(out, "config.json"))

  before = open(os.path.join(out, "config.json")).read()
  with pytest.raises(ValueError, match=r"--steps=2 is below step 4, where the resumed run "
                                       r"stands .*give --steps above 4"):
    _run(resume=True, steps=2, out_dir=out)
  with pytest.raises(ValueError, match="--resume continues the run .* --overwrite deletes it"):
    _run(resume=True, steps=6, out_dir=out, overwrite=True)
  exp = tmp_path / "export"
  os.makedirs(exp)
  (exp / "mine.txt").write_text("x")
  with pytest.raises(ValueError, match=f"--export_hf={exp} is not empty .*before training"):
    _run(resume=True, steps=6, out_dir=out, export_hf=str(exp))
  assert _steps(out) == [1, 2, 3, 4] and open(os.path.join(out, "config.json")).read() == before

  # every checkpoint unreadable: an error naming each, nothing moved, no fresh start
  saved = sorted(d for d in os.listdir(ck) if d.isdigit())
  for d in saved:
    with open(os.path.join(ck, d, "meta", "metadata"), "w") as f:
      f.write("{torn")
  with pytest.raises(UnreadableCheckpointsError) as e:
    _run(resume=True, steps=6, out_dir=out)
  msg = str(e.value)
  for d in saved:
    assert f"  step {d}: JSONDecodeError" in msg
  assert "pass --overwrite instead of --resume" in msg
  assert sorted(d for d in os.listdir(ck) if d.isdigit()) == saved
  assert not [d for d in os.listdir(ck) if d.startswith("corrupt")]
  assert _steps(out) == [1, 2, 3, 4] and open(os.path.join(out, "config.json")).read() == before
  assert not os.path.exists(os.path.join(out, ".lock"))
