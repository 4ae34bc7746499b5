"""The shell commands of README.md and docs/*.md, and how the test suite exercises each.

`doc_commands()` reads every fenced ```bash / ```sh block (continuation lines joined, comments
dropped). `COVERAGE` names, for every such command, how it is exercised:

  Run(...)      tests/docs runs it (as written, or with the cheaper settings it names);
  Mapped(...)     a test elsewhere runs the same command or an equivalent (the node id is
                checked to exist; `experiments.*` flags are parsed by tests/docs either way);
  CI(...)       .ci/run runs it;
  External(...) another tool's command (Ray's CLI): its options are checked against `--help`.

A command added to the docs without an entry here, or an entry whose command left the docs,
fails `test_every_doc_command_has_an_entry`.
"""
import dataclasses
import glob
import os
import re
import shlex

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC_FILES = ["README.md"] + sorted(os.path.relpath(p, REPO)
                                   for p in glob.glob(os.path.join(REPO, "docs", "*.md")))


@dataclasses.dataclass(frozen=True)
class Run:
  test: str  # the tests/docs test that runs it
  how: str = "as written"


@dataclasses.dataclass(frozen=True)
class Mapped:
  test: str  # pytest node id (file::function) of a test that runs it or an equivalent
  how: str = "the same flags"


@dataclasses.dataclass(frozen=True)
class CI:
  how: str


@dataclasses.dataclass(frozen=True)
class External:
  tool: str
  options: tuple[str, ...]  # options the command uses, each checked against `tool --help`


def normalize(command: str) -> str:
  return " ".join(shlex.split(command, comments=True))


def doc_commands() -> dict[str, list[str]]:
  """{normalized command: [doc files it appears in]}."""
  out: dict[str, list[str]] = {}
  for name in DOC_FILES:
    with open(os.path.join(REPO, name)) as f:
      text = f.read()
    for block in re.findall(r"^```(?:bash|sh)\n(.*?)^```", text, flags=re.S | re.M):
      for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        cmd = normalize(line)
        if cmd:
          out.setdefault(cmd, []).append(name)
  return out


def module_args(command: str, module: str) -> list[str] | None:
  """The arguments after `python -m <module>`, or None for another command."""
  tokens = shlex.split(command)
  for i in range(len(tokens) - 1):
    if tokens[i] == "-m" and tokens[i + 1] == module:
      return tokens[i + 2:]
  return None


_CLI = "tests/experiments/test_grpo_cli.py"
_HARNESS = "tests/harness/test_cli_harness.py"
_RAY_CLI = "tests/experiments/test_grpo_ray_cli.py"
_SIM = "tests/sim/test_experiment.py"
_RUNS = "tests/docs/test_doc_runs.py"
_MULTI = "tests/train/loop/test_multihost.py"
_TWO = ("python -m experiments.grpo --mesh=2x4 --steps=3 --prompts_per_step=4 --sft_steps=0 "
        "--num_processes=2 --coordinator_address=localhost:12355 --out_dir=runs/two-processes")
_CMDS = "tests/docs/test_doc_commands.py"

COVERAGE = {
    # README quick start: the two commands CI and a new user run.
    "bash scripts/quickstart.sh": Run(
        f"{_RUNS}::test_quickstart_main_job_with_eval",
        "the script's last line, `python -m experiments.grpo` with its defaults and --steps=2 "
        "(the script's install step is what scripts/test.sh does in CI)"),
    "bash scripts/test.sh": CI(".ci/run ends with `exec bash scripts/test.sh`"),
    "python -m experiments.grpo --steps=20 --eval_every=10": Run(
        f"{_RUNS}::test_quickstart_main_job_with_eval", "--steps=2 --eval_every=2"),
    "python -m experiments.grpo --steps=10 --out_dir=runs/demo": Mapped(
        f"{_CLI}::test_sigterm_then_resume_is_bit_exact", "--steps=40 --save_every=2, SIGTERM"),
    "python -m experiments.grpo --steps=20 --out_dir=runs/demo --resume": Mapped(
        f"{_CLI}::test_sigterm_then_resume_is_bit_exact", "the same run resumed with --resume"),
    "python -m experiments.grpo --steps=40 --save_every=2 --out_dir=runs/ck": Mapped(
        f"{_CLI}::test_sigterm_then_resume_is_bit_exact"),
    "python -m experiments.grpo --steps=40 --save_every=2 --out_dir=runs/ck --resume": Mapped(
        f"{_CLI}::test_sigterm_then_resume_is_bit_exact"),
    "python -m experiments.grpo --learning_rate=1e6 --steps=30": Mapped(
        f"{_HARNESS}::test_divergence_exits_nonzero_and_never_done"),
    "python -m experiments.grpo --config=examples/grpo_sums.yaml --steps=10 --out_dir=runs/a":
        Mapped(f"{_HARNESS}::test_config_file_round_trip", "a YAML config file, then its "
             "config.json; examples/grpo_sums.yaml is parsed by tests/docs"),
    "python -m experiments.grpo --config=runs/a/config.json --out_dir=runs/b": Mapped(
        f"{_HARNESS}::test_config_file_round_trip", "same final params"),
    "head -2 examples/sums.jsonl": Run(f"{_CMDS}::test_cheap_commands_run"),
    "python -m experiments.grpo --task=jsonl:examples/sums.jsonl "
    "--reward=examples.sums_reward:score --steps=60 --eval_every=20 --eval_prompts=20": Mapped(
        f"{_HARNESS}::test_jsonl_task_with_module_reward_learns",
        "the same flags on a generated copy of the sums data set"),
    "python -m experiments.grpo --rollout=ray --num_workers=2 --chaos_kill_every=3 "
    "--worker_token_delay=0.5 --steps=4 --prompts_per_step=8": Mapped(
        f"{_RAY_CLI}::test_chaos_run_survives_a_process_group_sigterm_and_resumes_exactly",
        "the same flags but --steps=2, plus --weight_store=tensorstore:DIR, a process-group "
        "SIGTERM after step 1, then --resume"),
    "python -m experiments.grpo --rollout=ray --num_workers=3 --offload=adaptive --steps=6 "
    "--prompts_per_step=16 --preempt_trace=jaxrl_sys/data/traces/parcae/trace_hh_55_65.txt "
    "--trace_time_scale=0.05": Mapped(
        f"{_RAY_CLI}::test_cli_ray_workers_with_chaos_and_adaptive_offload",
        "2 workers, the trace_ll_10_11 trace, 4 steps"),
    "ray start --head --port=6379": External("ray start", ("--head", "--port")),
    "ray start --address=HEAD_IP:6379 --num-gpus=1": External("ray start",
                                                              ("--address", "--num-gpus")),
    "python -m experiments.grpo --rollout=ray --ray_address=auto --num_workers=8 "
    "--worker_gpus=1 --worker_cpus=4 --weight_store=tensorstore:/shared/jaxrl/weights": Mapped(
        f"{_RAY_CLI}::test_chaos_run_survives_a_process_group_sigterm_and_resumes_exactly",
        "a local Ray instance instead of a cluster, with a tensorstore weight store; "
        "--worker_gpus: test_worker_asking_for_missing_resources_is_a_clear_error"),
    "python -m examples.make_tiny_hf_model /tmp/tiny-qwen3": Run(
        f"{_RUNS}::test_hf_model_train_export_and_load", "into a temporary directory"),
    "python -m experiments.grpo --model=/tmp/tiny-qwen3 --steps=5 --prompts_per_step=8 "
    "--out_dir=runs/hf-demo --export_hf=runs/hf-demo/hf": Run(
        f"{_RUNS}::test_hf_model_train_export_and_load", "paths in a temporary directory"),
    """python -c "import transformers; """
    """transformers.AutoModelForCausalLM.from_pretrained('runs/hf-demo/hf')\"""": Run(
        f"{_RUNS}::test_hf_model_train_export_and_load", "paths in a temporary directory"),
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m experiments.grpo --mesh=2x4":
        Mapped("tests/train/loop/test_loop.py::test_mesh_2x4_matches_1x1",
             "the 2x4 mesh on 8 fake CPU devices, 3 steps"),
    "python -m experiments.grpo --helpfull": Run(f"{_CMDS}::test_cheap_commands_run"),
    "python -m experiments.grpo --steps=40 --save_every=1 --mode=async --max_staleness=1": Mapped(
        f"{_CLI}::test_sigkill_resumes_from_last_checkpoint_without_losing_the_buffer"),
    "python -m experiments.grpo --mesh=8x4 --steps=1 --prompts_per_step=8": Mapped(
        f"{_CLI}::test_mesh_8x4_on_32_fake_devices"),
    "python -m experiments.grpo --task=search --task_args=hops=1 --max_turns=3 --steps=40 "
    "--out_dir=runs/search": Mapped(
        "tests/agents/test_agent_recipe.py::test_held_out_episode_success_rises",
        "an agentic task through the recipe (the calculator; the search task trains in "
        "tests/notebooks/test_notebooks.py::test_agentic_search_trains_over_episodes)"),
    "python -m experiments.grpo --task=jsonl:examples/sums.jsonl "
    "--env=examples.adder_env:AdderEnv --max_turns=2 --steps=20": Mapped(
        "tests/agents/test_agent_recipe.py::test_user_env_from_the_env_flag",
        "the same flags parsed and built; the env's episodes over a scripted session"),
    "python -m experiments.spot_sim": Mapped(
        f"{_SIM}::test_the_experiment_prints_tables_and_writes_json_and_plots",
        "one preset, two settings, one segment, 2 steps"),
    "python -m experiments.spot_sim --preset=qwen3-14b --settings=rlboost,restart --segments=0":
        Run(f"{_CMDS}::test_cheap_commands_run", "--max_steps=2 --jobs=1"),
    _TWO + " --process_id=0": Mapped(
        f"{_MULTI}::test_two_processes_match_one_process_and_only_process_0_writes",
        "both commands together (a free port on 127.0.0.1, the run directory in a temporary "
        "directory), SIGTERM to process 1 after step 1, then both again with --resume"),
    _TWO + " --process_id=1": Mapped(
        f"{_MULTI}::test_two_processes_match_one_process_and_only_process_0_writes",
        "both commands together, as above"),
    "srun --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 python -m experiments.grpo --mesh=8x4 "
    "--local_device_ids=0,1,2,3,4,5,6,7 --out_dir=/shared/runs/grpo-8x4": Mapped(
        f"{_MULTI}::test_two_processes_match_one_process_and_only_process_0_writes",
        "the same job on one machine: SLURM supplies the coordinator, process count and id "
        "that the two-process command passes as flags (detection: "
        "tests/train/multihost/test_job.py)"),
    'gcloud compute tpus tpu-vm ssh my-slice --zone=us-central2-b --worker=all --command="cd '
    'jaxrl_sys && .venv/bin/python -m experiments.grpo --mesh=8x4 '
    '--out_dir=/mnt/shared/runs/grpo-8x4"': Mapped(
        f"{_MULTI}::test_two_processes_match_one_process_and_only_process_0_writes",
        "the same job on one machine: the TPU runtime supplies the coordinator, process count "
        "and id"),
    "python -m experiments.grpo --lora.rank=8 --lora.alpha=16 --learning_rate=4e-3 --steps=60 "
    "--out_dir=runs/lora --export_peft=runs/lora/adapter": Mapped(
        f"{_HARNESS}::test_lora_learns_and_its_peft_export_loads_onto_the_base",
        "the same LoRA flags on the learning test's sums data set"),
    "python -m experiments.spot_sim --preset=all --settings=rlboost --segments=0,1 "
    "--lora_rank=16": Mapped(
        "tests/sim/test_lora_sim.py::test_first_pull_moves_the_base_then_adapters_only",
        "the preset --lora_rank adds (sim.presets.with_lora) and its pulls; the command's "
        "tables: test_the_experiment_prints_tables_and_writes_json_and_plots"),
    # the notebook itself runs in tests/notebooks through nbclient, the engine of this command
    "JAXRL_SMALL=1 jupyter execute --inplace notebooks/01_quickstart_grpo.ipynb": External(
        "jupyter execute", ("--inplace",)),
    "python -m benchmarks.algorithms": Mapped(
        "tests/benchmarks/test_algorithms_quick.py::test_algorithms_quick",
        "--quick --only moe,collapse (the full run takes ~20 min on 2 cores)"),
    "python -m benchmarks.algorithms --quick": Mapped(
        "tests/benchmarks/test_algorithms_quick.py::test_algorithms_quick",
        "--quick --only moe,collapse"),
    "python -m experiments.grpo --mode=async --max_staleness=8 --learning_rate=5e-3 "
    "--kl_coef=0": Mapped(
        "tests/benchmarks/test_algorithms_quick.py::test_algorithms_quick",
        "the same settings through the recipe API, 24 steps of 32 prompts: the collapse note"),
    "python -m experiments.spot_sim --preset=measured:benchmarks/results": Mapped(
        "tests/sim/test_driver.py::"
        "test_a_preset_calibrated_from_our_benchmarks_drives_the_same_simulation",
        "calibrate_from_benchmarks on benchmark JSON, then a simulation with that preset"),
}
