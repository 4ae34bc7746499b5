"""The GRPO step side by side with TRL (PyTorch) and Tunix (JAX) on one CPU machine.

    python -m benchmarks.peers.compare [--runs 3] [--models qwen2-tiny,qwen3_moe-tiny]
        [--workdir DIR] [--locked] [--dry-run]

Everything runs offline from this checkout. The first call creates one virtual environment per
peer under `--workdir` (default /tmp/jaxrl_sys-peers) and installs the versions that were
measured: TRL 1.16.0 with transformers 5.23.0 and the CPU build of torch 2.13.0; google-tunix
0.1.7 with jax 0.10.2 and flax 0.12.8 (`--locked`: the full pinned environments of
`requirements-trl.txt` / `requirements-tunix.txt`). The TRL environment then writes the tiny
models (`make_tiny_model.py`: a random Qwen2 and a random Qwen3-MoE with a byte-level BPE
tokenizer, offline), so all three frameworks train the same weights on the same token ids.

Each run executes, for each model, the three in turn, interleaved (TRL, Tunix, ours, TRL, ...)
so that machine noise hits all three alike: `trl_grpo.py` and `tunix_grpo.py` in their own
environments, and ours as `python -m experiments.grpo` with this interpreter and the same
workload (8 "a+b=" prompts x G=8, exactly 32 new tokens, KL 0.04 with a reference forward,
AdamW lr 1e-5, float32, the raw prompt text: `--nochat_template`). Every framework reports the
medians of its steps 3..8; the table shows the median over runs of the step, rollout and train
times, the generation rate and the peak memory, and the step-time ratio peer / ours. Results:
benchmarks/results/peers.json. `--dry-run` prints every command and runs none.

Not part of the test suite (minutes per run, and the peers' installs); tests/docs runs its
`--dry-run`.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODELS = {"qwen2-tiny": "qwen2", "qwen3_moe-tiny": "qwen3_moe"}
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
KEYS = ("median_step_s", "median_rollout_s", "median_train_s", "median_gen_tok_per_s",
        "peak_rss_mb")
# Our CLI with the peers' workload (the flags `experiments.grpo --helpfull` documents).
OURS_FLAGS = ("--task=arithmetic", "--task_args=num_digits=2,ops=+", "--group_size=8",
              "--prompts_per_step=8", "--max_new_tokens=32", "--max_prompt_len=8",
              "--sft_steps=0", "--kl_coef=0.04", "--learning_rate=1e-5", "--lr_warmup_steps=0",
              "--nochat_template", "--progress=false", "--compile_cache=")


@dataclasses.dataclass(frozen=True)
class Peer:
  """A peer framework: its environment's pinned packages and its benchmark script."""
  name: str
  packages: tuple[str, ...]        # top-level pins, installed in this order
  locked: str                      # the full `pip freeze` of the measured environment
  script: str
  index: str | None = None         # an extra package index (torch's CPU wheels)


PEERS = {
    "trl": Peer("trl", ("torch==2.13.0", "trl==1.16.0 transformers==5.23.0 accelerate==1.15.0 "
                        "datasets==5.2.0 tokenizers==0.23.3"),
                "requirements-trl.txt", "trl_grpo.py", index=TORCH_CPU_INDEX),
    "tunix": Peer("tunix", ("google-tunix==0.1.7 jax[cpu]==0.10.2 jaxlib==0.10.2 flax==0.12.8 "
                            "optax==0.2.8",),
                  "requirements-tunix.txt", "tunix_grpo.py"),
}


@dataclasses.dataclass
class Runner:
  """Runs commands, or only prints them (`dry`)."""
  dry: bool

  def run(self, argv: list[str], *, env: dict | None = None, cwd: str | None = None,
          capture: bool = False) -> str:
    print("$ " + " ".join(shlex.quote(a) for a in argv), flush=True)
    if self.dry:
      return ""
    p = subprocess.run(argv, env=env, cwd=cwd, text=True, check=False,
                       stdout=subprocess.PIPE if capture else None)
    if p.returncode:
      sys.exit(f"failed ({p.returncode}): {' '.join(argv)}")
    return p.stdout or ""


def python_of(workdir: str, peer: str) -> str:
  return os.path.join(workdir, f"venv-{peer}", "bin", "python")


def setup(runner: Runner, workdir: str, peer: Peer, locked: bool) -> None:
  """Creates the peer's environment and installs its pinned packages (skipped when present)."""
  py = python_of(workdir, peer.name)
  if os.path.exists(py) and not runner.dry:
    print(f"# {peer.name}: {os.path.dirname(os.path.dirname(py))} exists", flush=True)
    return
  runner.run([sys.executable, "-m", "venv", os.path.dirname(os.path.dirname(py))])
  pip = [py, "-m", "pip", "install", "-q"]
  runner.run(pip + ["--upgrade", "pip"])
  index = ["--extra-index-url", peer.index] if peer.index else []
  if locked:
    runner.run(pip + index + ["--no-deps", "-r", os.path.join(HERE, peer.locked)])
    return
  for group in peer.packages:  # torch first, so that nothing resolves another (CUDA) build
    runner.run(pip + index + group.split())


def build_models(runner: Runner, workdir: str, names: list[str]) -> dict[str, str]:
  """The tiny models (written once, by the TRL environment's transformers)."""
  out = {}
  for name in names:
    path = os.path.join(workdir, "models", name)
    if runner.dry or not os.path.exists(os.path.join(path, "config.json")):
      runner.run([python_of(workdir, "trl"), os.path.join(HERE, "make_tiny_model.py"), path,
                  "--arch", MODELS[name]])
    out[name] = path
  return out


def summary_of(text: str) -> dict | None:
  for line in text.splitlines():
    if line.startswith("SUMMARY "):
      return json.loads(line.split(" ", 1)[1])
  return None


def run_peer(runner: Runner, workdir: str, peer: Peer, model: str) -> dict | None:
  env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", JAX_PLATFORMS="cpu")
  out = runner.run([python_of(workdir, peer.name), os.path.join(HERE, peer.script), "--model",
                    model], env=env, capture=True)
  return summary_of(out)


def run_ours(runner: Runner, model: str) -> dict | None:
  """The workload on `python -m experiments.grpo`, in a process of its own (`--ours`: its
  peak memory is that process's child's alone), summarised as the peer scripts do."""
  out = runner.run([sys.executable, "-m", "benchmarks.peers.compare", "--ours", model],
                   env=dict(os.environ, JAX_PLATFORMS="cpu"), cwd=REPO, capture=True)
  return summary_of(out)


def ours(model: str, steps: int = 8, warmup_steps: int = 2) -> dict:
  """Runs our CLI on `model` (the child's memory is this process's children's peak)."""
  out_dir = tempfile.mkdtemp(prefix="ours-grpo-")
  t0 = time.perf_counter()
  subprocess.run([sys.executable, "-m", "experiments.grpo", f"--model={model}", *OURS_FLAGS,
                  f"--steps={steps}", f"--out_dir={out_dir}"], cwd=REPO, check=True)
  rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))
          if line.strip()]
  steady = rows[warmup_steps:]
  med = lambda k: statistics.median(r[k] for r in steady)  # noqa: E731
  rate = [r["response_len_mean"] * r["num_sequences"] / r["time_rollout"] for r in steady]
  return {"framework": "ours", "model": os.path.basename(model), "steps": len(rows),
          "median_step_s": med("time_step"), "median_rollout_s": med("time_rollout"),
          "median_train_s": med("time_train"), "median_gen_tok_per_s": statistics.median(rate),
          "total_process_wall_s": time.perf_counter() - t0,
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def table(results: list[dict]) -> list[dict]:
  """Median over runs per (model, framework), with the step-time ratio peer / ours."""
  groups = collections.defaultdict(list)
  for r in results:
    groups[(r["model"], r["framework"])].append(r)
  rows = []
  for (model, fw), rs in sorted(groups.items()):
    row = {"model": model, "framework": fw, "runs": len(rs)}
    row.update({k: statistics.median(r[k] for r in rs) for k in KEYS})
    rows.append(row)
  ours = {r["model"]: r["median_step_s"] for r in rows if r["framework"] == "ours"}
  for row in rows:
    if row["model"] in ours:
      row["step_vs_ours"] = row["median_step_s"] / ours[row["model"]]
  return rows


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--runs", type=int, default=3, help="interleaved runs per model")
  ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {list(MODELS)}")
  ap.add_argument("--frameworks", default="trl,tunix,ours", help="comma-separated subset")
  ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "jaxrl_sys-peers"),
                  help="the peers' environments and the models")
  ap.add_argument("--locked", action="store_true",
                  help="install the full pinned environments (requirements-*.txt)")
  ap.add_argument("--dry-run", action="store_true", help="print the commands, run none")
  ap.add_argument("--ours", metavar="MODEL_DIR", help=argparse.SUPPRESS)  # one run of ours
  args = ap.parse_args(argv)
  if args.ours:
    print("SUMMARY " + json.dumps(ours(args.ours)))
    return 0
  models = [m for m in args.models.split(",") if m]
  frameworks = [f for f in args.frameworks.split(",") if f]
  bad = sorted(set(models) - set(MODELS)) + sorted(set(frameworks) - {*PEERS, "ours"})
  if bad or args.runs < 1:
    ap.error(f"unknown models / frameworks {bad} or --runs < 1")
  runner = Runner(dry=args.dry_run)
  peers = [PEERS[f] for f in frameworks if f in PEERS]
  needed = {p.name for p in peers} | {"trl"}  # the TRL environment writes the models
  for peer in PEERS.values():
    if peer.name in needed:
      setup(runner, args.workdir, peer, args.locked)
  paths = build_models(runner, args.workdir, models)
  results = []
  for i in range(args.runs):
    for name in models:
      print(f"# run {i + 1}/{args.runs}, {name}", flush=True)
      for fw in frameworks:
        got = (run_ours(runner, paths[name]) if fw == "ours"
               else run_peer(runner, args.workdir, PEERS[fw], paths[name]))
        if got is not None:
          results.append(got)
  if runner.dry:
    return 0
  from benchmarks.common import print_table, write_json  # pylint: disable=import-outside-toplevel
  rows = table(results)
  print_table(rows, ["model", "framework", "runs", *KEYS, "step_vs_ours"])
  write_json("peers", {"rows": rows, "runs": results, "workdir": args.workdir})
  return 0


if __name__ == "__main__":
  sys.exit(main())
