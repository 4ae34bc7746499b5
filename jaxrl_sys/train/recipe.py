"""The end-to-end GRPO recipe behind `python -m experiments.grpo`, as a frozen config.

Default: a tiny dense model on 1-digit addition, a short supervised warm-up that leaves the
reward mid-range, then GRPO; it learns visibly in about a minute on a 2-core CPU.
`build_recipe` validates everything (mesh, algorithm, group size, lengths) before any work.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import jax
import numpy as np

from jaxrl_sys.models import init_params
from jaxrl_sys.sharding import MeshSpec, make_mesh, parse_mesh
from jaxrl_sys.tasks import make_task
from jaxrl_sys.train.config import (ALGOS, CheckpointConfig, LoopConfig, OptimConfig, TrainConfig,
                                    train_config_for_algo)
from jaxrl_sys.train.groups import encode_prompt
from jaxrl_sys.train.loop import RLLoop, RunResult, check_lengths, default_engine_config
from jaxrl_sys.train.metrics_log import plot_history
from jaxrl_sys.train.presets import LoadedModel, load_model
from jaxrl_sys.train.rollout_setup import RolloutSetup, ray_client
from jaxrl_sys.train.supervised import supervised_warmup

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
  """Everything `experiments.grpo` exposes as flags (see its --help for each field)."""
  mesh: str = "1x1"
  algo: str = "grpo"
  model: str = "tiny"
  task: str = "arithmetic"
  task_args: str = "num_digits=1,ops=+"
  group_size: int = 4
  prompts_per_step: int = 64
  steps: int = 100
  mode: str = "sync"
  max_staleness: int = 0
  micro_batch_groups: int = 16
  dynamic_micro_batching: bool = True
  max_new_tokens: int = 4
  max_prompt_len: int = 8
  temperature: float = 1.0
  oversample: float = 1.0
  learning_rate: float = 1e-3
  lr_warmup_steps: int = 5
  kl_coef: float | None = None
  sft_steps: int = 60
  sft_learning_rate: float = 3e-3
  sft_batch_size: int = 32
  checkpoint_dir: str | None = None
  save_every: int = 10
  keep_checkpoints: int = 3
  seed: int = 0
  out_dir: str | None = None
  progress: bool = True
  rollout: str = "local"
  num_workers: int = 2
  ray_address: str | None = None
  weight_store: str | None = None
  preempt_trace: str | None = None
  trace_time_scale: float = 1.0 / 60.0
  chaos_kill_every: float = 0.0
  chaos_restart_after: float = 2.0
  worker_token_delay: float = 0.0
  offload: str = "off"
  t_seed_init: float = 2.0


def parse_task_args(text: str) -> dict[str, Any]:
  """"num_digits=1,ops=+" -> {"num_digits": 1, "ops": "+"} (ints and floats converted)."""
  out: dict[str, Any] = {}
  for part in filter(None, (p.strip() for p in text.split(","))):
    if "=" not in part:
      raise ValueError(f"bad task argument {part!r}: expected key=value")
    k, v = part.split("=", 1)
    for cast in (int, float):
      try:
        v = cast(v)
        break
      except ValueError:
        continue
    out[k.strip()] = v
  return out


@dataclasses.dataclass
class Recipe:
  """Built objects: mesh, model (config, tokenizer, params or None), task, configs."""
  config: RecipeConfig
  mesh_spec: MeshSpec
  model: LoadedModel
  task: Any
  train: TrainConfig
  loop: LoopConfig
  checkpoint: CheckpointConfig
  rollout: RolloutSetup


def build_recipe(rc: RecipeConfig) -> Recipe:
  """Validates `rc` and builds its pieces (no JAX computation, no mesh yet).

  Raises:
    ValueError: with a message naming the bad input (mesh string, algorithm, group size,
      prompt longer than the context, unknown model or task).
  """
  spec = parse_mesh(rc.mesh)
  if rc.algo not in ALGOS:
    raise ValueError(f"unknown --algo {rc.algo!r}; choose one of {ALGOS}")
  if rc.group_size < 2:
    raise ValueError(
        f"--group_size={rc.group_size} with --algo={rc.algo}: GRPO-family advantages compare "
        "samples of the same prompt, so each group needs at least 2 samples")
  model = load_model(rc.model, max_seq_len=rc.max_prompt_len + rc.max_new_tokens)
  task = make_task(rc.task, **parse_task_args(rc.task_args))
  decoupled = rc.mode != "sync"
  optim = OptimConfig(learning_rate=rc.learning_rate, warmup_steps=rc.lr_warmup_steps)
  train = train_config_for_algo(rc.algo, decoupled=decoupled, kl_coef=rc.kl_coef, optim=optim,
                                temperature=rc.temperature)
  loop = LoopConfig(steps=rc.steps, prompts_per_step=rc.prompts_per_step,
                    group_size=rc.group_size, mode=rc.mode, max_staleness=rc.max_staleness,
                    micro_batch_groups=rc.micro_batch_groups,
                    dynamic_micro_batching=rc.dynamic_micro_batching,
                    max_new_tokens=rc.max_new_tokens, max_prompt_len=rc.max_prompt_len,
                    temperature=rc.temperature, oversample=rc.oversample, seed=rc.seed)
  check_lengths(model.config, loop)
  encode_prompt(model.tokenizer, task.problem(0).prompt, rc.max_prompt_len)  # fail early
  ckpt = CheckpointConfig(directory=rc.checkpoint_dir, save_every=rc.save_every,
                          keep=rc.keep_checkpoints)
  rollout = RolloutSetup(rollout=rc.rollout, num_workers=rc.num_workers,
                         ray_address=rc.ray_address, weight_store=rc.weight_store,
                         preempt_trace=rc.preempt_trace, trace_time_scale=rc.trace_time_scale,
                         chaos_kill_every=rc.chaos_kill_every,
                         chaos_restart_after=rc.chaos_restart_after,
                         worker_token_delay=rc.worker_token_delay, offload=rc.offload,
                         t_seed_init=rc.t_seed_init)
  return Recipe(rc, spec, model, task, train, loop, ckpt, rollout)


def recipe_mesh(spec: MeshSpec) -> jax.sharding.Mesh:
  """The mesh on the default backend, or on CPU devices when the accelerator has too few
  (CPU devices are faked by `--xla_force_host_platform_device_count`)."""
  devices = jax.devices()
  if spec.size > len(devices) and jax.default_backend() != "cpu":
    cpus = jax.devices("cpu")
    if len(cpus) >= spec.size:
      log.warning("mesh %s needs %d devices, %d %s present: using %d CPU devices", spec,
                  spec.size, len(devices), jax.default_backend(), spec.size)
      devices = cpus
  return make_mesh(spec, devices)


def run_recipe(recipe: Recipe, *, resume: bool = False) -> RunResult:
  """Warm-up (fresh runs only), GRPO, final artefacts (params .npz, plot) in out_dir."""
  rc, mc, tok = recipe.config, recipe.model.config, recipe.model.tokenizer
  mesh = recipe_mesh(recipe.mesh_spec)

  def init():
    params = recipe.model.params
    if params is None:
      params = jax.jit(init_params, static_argnums=0)(mc, jax.random.PRNGKey(rc.seed))
    seq = rc.max_prompt_len + rc.max_new_tokens
    return supervised_warmup(params, mc, recipe.task, tok, steps=rc.sft_steps,
                             batch_size=rc.sft_batch_size, learning_rate=rc.sft_learning_rate,
                             seq_len=seq)

  if rc.out_dir:
    os.makedirs(rc.out_dir, exist_ok=True)
    with open(os.path.join(rc.out_dir, "config.json"), "w", encoding="utf-8") as f:
      json.dump(dataclasses.asdict(rc), f, indent=1)
  client = None
  if recipe.rollout.rollout == "ray":
    engine = default_engine_config(recipe.loop, recipe.loop.group_size + int(
        recipe.train.advantage.baseline == "median"), tok.eos_id)
    client = ray_client(recipe.rollout, mc, engine, seed=rc.seed,
                        compile_cache=jax.config.jax_compilation_cache_dir or None)
  loop = RLLoop(mc, recipe.train, recipe.loop, recipe.task, tok, mesh, init_params=init,
                client=client, checkpoint=recipe.checkpoint, resume=resume, out_dir=rc.out_dir,
                progress=rc.progress, offload=recipe.rollout.offload_config())
  try:
    result = loop.run()
  finally:
    if client is not None:
      client.close()
  if rc.out_dir:
    save_params(os.path.join(rc.out_dir, "final_params.npz"), result.state.params)
    history = _read_history(rc.out_dir) or result.history
    plot_history(history, os.path.join(rc.out_dir, "reward_kl.png"), ("reward_mean", "kl"),
                 title=f"{rc.algo} on {rc.task} ({rc.mode}, mesh {rc.mesh})")
    if recipe.rollout.rollout == "ray":
      plot_history(history, os.path.join(rc.out_dir, "offload.png"),
                   ("t_seed", "live_workers", "time_step"),
                   title=f"rollout offload ({rc.offload}, {rc.num_workers} Ray workers)")
  return result


def save_params(path: str, params) -> None:
  """Writes the parameters as a flat .npz ("layers/attn/wq" -> array), no pickles."""
  flat = {"/".join(str(getattr(k, "key", k)) for k in kp): np.asarray(v)
          for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  tmp = path + ".tmp.npz"
  np.savez(tmp, **flat)
  os.replace(tmp, path)


def _read_history(out_dir: str) -> list[dict]:
  path = os.path.join(out_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  rows = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        row = json.loads(line)
        rows[row["step"]] = row  # a resumed run rewrites later steps
  return [rows[k] for k in sorted(rows)]
