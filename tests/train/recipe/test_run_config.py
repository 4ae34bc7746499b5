"""The config tree: flags generated from its fields, aliases, config files, one validation."""
import dataclasses
import json
import os
import re
import shutil
import subprocess

import pytest
from absl import flags

from jaxrl_sys.train.recipe import cli, config_file, run_config
from jaxrl_sys.train.recipe.run_config import ALIASES, RecipeConfig, RunConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
# The flags `python -m experiments.grpo` defined by hand before the tree (commands in README,
# docs and notebooks use them): every one must still parse.
SHORT_FLAGS = """mesh algo model task task_args reward group_size prompts_per_step steps mode
max_staleness micro_batch_groups dynamic_micro_batching max_new_tokens max_prompt_len temperature
oversample learning_rate lr_warmup_steps kl_coef skip_nonfinite sft_steps sft_learning_rate
sft_batch_size chat_template eval_every eval_prompts checkpoint_dir save_every keep_checkpoints
seed out_dir overwrite export_hf progress rollout num_workers local_workers ray_address
weight_store preempt_trace trace_time_scale chaos_kill_every chaos_restart_after offload
t_seed_init worker_cpus worker_gpus worker_token_delay coordinator_address num_processes
process_id local_device_ids distributed_timeout""".split()
# ... and the precision flags issue 26 names (--param_dtype, ...), typed as often.
SHORT_FLAGS += "param_dtype compute_dtype rollout_dtype behav_weight_cap export_dtype".split()
SHORT_FLAGS += ["export_peft"]  # beside --export_hf (issue 41, LoRA)
SHORT_FLAGS += "env max_turns tool_timeout tool_workers".split()  # multi-turn episodes


def _flags() -> flags.FlagValues:
  fv = flags.FlagValues()
  cli.define_flags(fv)
  return fv


def _docstring_entries(cls) -> set[str]:
  """Field names documented under `Attributes:` (read with a plain regex, not the parser)."""
  doc = cls.__doc__.split("Attributes:")[1]
  names = set()
  for m in re.finditer(r"^    ([a-z_][a-z0-9_, ]*):", doc, re.M):
    names |= {n.strip() for n in m.group(1).split(",")}
  return names


def test_every_setting_has_a_flag_with_its_docstring_as_help():
  fv = _flags()
  generated = {name for name in fv if "." in name}
  expected = set()
  for section, cls in run_config.sections().items():
    documented = _docstring_entries(cls)
    for f in dataclasses.fields(cls):
      if f.name == "identity":  # derived by the recipe (CheckpointConfig), not a setting
        continue
      name = f"{section}.{f.name}"
      expected.add(name)
      assert f.name in documented, f"{cls.__name__}.{f.name} has no docstring entry"
      flag = fv[name]
      assert flag.default == getattr(getattr(RunConfig(), section), f.name), name
      # the help is the field's documentation, first words included
      first = re.search(rf"^    (?:[a-z_, ]*\b)?{f.name}\b[a-z_, ]*:\s*(\S+ \S+)",
                        cls.__doc__, re.M).group(1)
      assert flag.help.startswith(first), (name, flag.help)
  assert generated == expected


def test_short_flags_are_aliases_of_the_tree_fields():
  fv = _flags()
  assert set(SHORT_FLAGS) == set(ALIASES)
  for short, path in ALIASES.items():
    assert fv[short].help == f"Alias for --{path}."
  a, b = _flags(), _flags()
  a(["x", "--steps=7", "--mesh=2x4", "--model=tiny_moe", "--task=countdown",
     "--learning_rate=0.01", "--rollout=local", "--nodynamic_micro_batching", "--kl_coef=0"])
  b(["x", "--loop.steps=7", "--distributed.mesh=2x4", "--model.name=tiny_moe",
     "--task.name=countdown", "--optim.learning_rate=0.01", "--rollout.rollout=local",
     "--loop.dynamic_micro_batching=false", "--train.kl_coef=0"])
  ca, cb = cli.run_config_from_flags(a), cli.run_config_from_flags(b)
  assert ca == cb
  assert (ca.loop.steps, ca.distributed.mesh, ca.model.name, ca.task.name) == (
      7, "2x4", "tiny_moe", "countdown")
  assert ca.optim.learning_rate == 0.01 and ca.train.kl_coef == 0.0
  assert not ca.loop.dynamic_micro_batching
  assert cli.run_config_from_flags(_flags()) == RunConfig()


def test_recipe_config_facade_matches_the_tree():
  rc = RecipeConfig(steps=30, out_dir="runs/py", learning_rate=0.002)
  tree = rc.run_config()
  assert tree == RunConfig().replace(**{"loop.steps": 30, "output.out_dir": "runs/py",
                                        "optim.learning_rate": 0.002})
  assert [f.name for f in dataclasses.fields(RecipeConfig)] == list(ALIASES)
  assert RecipeConfig().run_config() == RunConfig()
  assert tree.get("steps") == 30 and tree.get("model") == "tiny"
  assert tree.output.out_dir == "runs/py"
  with pytest.raises(AttributeError):  # short names are the CLI's and the façade's, not the tree's
    tree.steps  # noqa: B018  pylint: disable=pointless-statement


def test_config_file_tree_flat_and_dotted_forms_agree(tmp_path):
  nested = {"loop": {"steps": 2, "seed": 3}, "optim": {"learning_rate": 0.002},
            "model": {"name": "tiny_moe"}}
  flat = {"steps": 2, "seed": 3, "learning_rate": 0.002, "model": "tiny_moe"}
  dotted = {"loop.steps": 2, "loop.seed": 3, "optim.learning_rate": 0.002,
            "model.name": "tiny_moe"}
  want = {"loop.steps": 2, "loop.seed": 3, "optim.learning_rate": 0.002,
          "model.name": "tiny_moe"}
  for data in (nested, flat, dotted):
    assert config_file.flat_settings(data) == want
  with pytest.raises(ValueError, match=r"'loop.stepz' \(did you mean 'loop.steps'\?\)"):
    config_file.flat_settings({"loop": {"stepz": 2}})
  with pytest.raises(ValueError, match="loop.steps is given twice"):
    config_file.flat_settings({"steps": 2, "loop": {"steps": 3}})
  # a run's config.json: the tree without output locations; read back, the same settings
  rc = RunConfig().replace(steps=2, out_dir="x", checkpoint_dir="y", export_hf="z")
  written = json.loads(json.dumps(config_file.reproducible(rc)))
  assert "output" not in written and "directory" not in written["checkpoint"]
  fv = _flags()
  path = tmp_path / "config.json"
  path.write_text(json.dumps(written))
  fv(["x", "--seed=5"])
  cli.apply_config_file(str(path), fv)
  got = cli.run_config_from_flags(fv)
  assert got == RunConfig().replace(steps=2, seed=5)  # the command line wins


def test_examples_config_file_still_reads():
  data = config_file.read_config_file(os.path.join(REPO, "examples", "grpo_sums.yaml"))
  settings = config_file.flat_settings(data)
  assert settings["task.name"] == "jsonl:examples/sums.jsonl" and settings["loop.steps"] == 60


@pytest.mark.parametrize("kw,message", [
    (dict(group_size=1, algo="dapo"), "loop.group_size=1 with train.algo=dapo"),
    (dict(steps=0), "loop.steps=0: nothing to train"),
    (dict(sft_batch_size=0), "warmup.batch_size=0 must be >= 1"),
    (dict(keep_checkpoints=0), "checkpoint.keep=0 must be >= 1"),
    (dict(algo="ppo"), "unknown train.algo 'ppo'"),
])
def test_validated_on_construction_with_the_flag_name(kw, message):
  with pytest.raises(ValueError, match=message):
    RecipeConfig(**kw)
  with pytest.raises(ValueError, match=message):
    RunConfig().replace(**kw)


def test_no_settings_restated_between_experiments_and_train():
  """The CLI defines no run setting by hand, and a duplicate-code scan (when the `duplicates`
  tool is installed) pairs no code of experiments/ with train/ and no non-boilerplate code of
  the config tree with another place of experiments/ or train/."""
  with open(os.path.join(REPO, "experiments", "grpo.py"), encoding="utf-8") as f:
    defined = re.findall(r"flags\.DEFINE_\w+\(\"(\w+)\"", f.read())
  assert sorted(defined) == ["compile_cache", "config", "resume"]
  tool = shutil.which("duplicates")
  if tool is None:
    pytest.skip("the duplicates scanner is not installed")
  out = subprocess.run([tool, "--most", "200", "--seconds", "60"], cwd=REPO, check=True,
                       capture_output=True, text=True).stdout
  assert "incomplete" not in out, out
  rows = [line for line in out.splitlines() if re.match(r"D\d+ ", line)]
  for row in rows:
    sides = row.split()[1:4:2]
    assert not (any(s.startswith("experiments/") for s in sides)
                and any(s.startswith("jaxrl_sys/train/") for s in sides)), row
    if any("recipe/run_config.py" in s or "recipe/cli.py" in s for s in sides):
      other = [s for s in sides if "recipe/run_config.py" not in s and "recipe/cli.py" not in s]
      assert "boilerplate" in row or not any(
          s.startswith(("experiments/", "jaxrl_sys/train/")) for s in other), row


def test_train_section_fields_reach_the_step_config():
  """A field added to the `train` section reaches `TrainConfig` under its name (no wiring)."""
  from jaxrl_sys.train.recipe import build_recipe  # pylint: disable=import-outside-toplevel
  from tests.train.common import QUICK  # pylint: disable=import-outside-toplevel
  for remat in (False, True):
    recipe = build_recipe(QUICK.run_config().replace(**{"train.remat": remat}))
    assert recipe.train.remat is remat
    assert recipe.config.train.remat is remat


def test_bad_settings_are_refused_at_the_edge(tmp_path):
  """Issue 44: `--steps=2 --loop.steps=3` trained 3 steps without a word, `loop: {steps: null}`
  ended in a TypeError traceback, `loop: 5` got "did you mean 'loop.seed'?", a negative or NaN
  --worker_token_delay failed 25 s into the run, and --coordinator_address without a port
  failed with "IndexError"."""
  fv = _flags()
  fv(["x", "--steps=2", "--loop.steps=3"])
  with pytest.raises(ValueError, match=r"--steps and --loop.steps both set loop.steps"):
    cli.run_config_from_flags(fv)
  fv = _flags()
  fv(["x", "--steps=2", "--steps=3"])  # one name twice: an override
  assert cli.run_config_from_flags(fv).loop.steps == 3
  with pytest.raises(ValueError, match=r"loop.steps is null, and it needs a value"):
    config_file.flat_settings({"loop": {"steps": None}})
  assert config_file.flat_settings({"loop": {"max_new_tokens": None}}) == {
      "loop.max_new_tokens": None}  # None means "the task's default" there
  with pytest.raises(ValueError, match=r"'loop' is a section, a mapping of its settings"):
    config_file.flat_settings({"loop": 5})
  for value in ("-1", "nan", "inf"):
    with pytest.raises(ValueError, match=rf"rollout.worker_token_delay={value}.* must be a "
                                         "finite number >= 0"):
      RunConfig().replace(**{"rollout.rollout": "ray",
                             "rollout.worker_token_delay": float(value)})
  for address in ("localhost", "localhost:", "localhost:99999", ":1234"):
    with pytest.raises(ValueError, match=r"coordinator_address=.*expected HOST:PORT"):
      RunConfig().replace(**{"distributed.coordinator_address": address})
