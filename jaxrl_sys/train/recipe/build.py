"""The end-to-end GRPO recipe behind `python -m experiments.grpo`: a `RunConfig` -> built
pieces (`build_recipe`, here) -> a run in its own directory (`recipe.run.run_recipe`).

Default: a tiny dense model on 1-digit addition, a short supervised warm-up that leaves the
reward mid-range, then GRPO; it learns visibly in about a minute on a 2-core CPU.
`build_recipe` validates everything (mesh, algorithm, group size, lengths, task, reward,
model files) before any work and fills the task- and model-dependent defaults (`None` fields);
it is the one place that turns run settings into the run's plan (`loop.plan.RunPlan`: the
step's, the loop's and rollout's configs and the arithmetic they share). The pieces a run is
made of are built from a recipe here, each in one place: the rollout sessions
(`rollout_session`, `eval_session`, through `rollout.setup.factory.make_client`) and the loop
(`make_loop`); `run_recipe` runs them in the run directory (see `recipe.run_dir`).

Bring your own task and model from Python:

    rc = RecipeConfig(model="/path/to/hf-model", task="jsonl:prompts.jsonl",
                      reward="mymod:score", steps=50, out_dir="runs/mine")
    result = run_recipe(build_recipe(rc))

or pass any object with `problem(i)` / `reward(problem, completion)` as
`build_recipe(rc, task=my_task)`.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import jax

from jaxrl_sys import backend
from jaxrl_sys.agents.config import AgentConfig
from jaxrl_sys.models import lora
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.setup.factory import make_client
from jaxrl_sys.rollout.setup.spec import ClientOptions, RolloutSetup
from jaxrl_sys.rollout.types import RolloutSession
from jaxrl_sys.sharding import DEFAULT_RULES, MeshSpec, parse_mesh
from jaxrl_sys.tasks import (CountingTask, DatasetTask, call_env_factory, load_env, make_task,
                             parse_task_spec)
from jaxrl_sys.tasks.turns import turn_format
from jaxrl_sys.tasks.dataset import unknown_characters_note
from jaxrl_sys.train.loop.config import CheckpointConfig, LoopConfig
from jaxrl_sys.train.loop.groups import encode_prompt
from jaxrl_sys.train.loop.periodic_eval import SYNTHETIC_EVAL_START
from jaxrl_sys.train.loop.plan import RunPlan
from jaxrl_sys.train.loop.rl_loop import RLLoop
from jaxrl_sys.train.recipe import limits
from jaxrl_sys.train.recipe.presets import LoadedModel, load_model
from jaxrl_sys.train.recipe.run_config import RecipeConfig, RunConfig
from jaxrl_sys.train.recipe.run_dir import check_directory_path
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.step.programs import train_programs

# Built-in tasks: (task_args, max_prompt_len, max_new_tokens) used when the config leaves them
# None. The tiny presets' warm-up steps when `sft_steps` is None (a user's model gets none).
TASK_DEFAULTS = {"arithmetic": ("num_digits=1,ops=+", 8, 4), "countdown": ("", 16, 8),
                 "calculator": ("", 16, 64), "search": ("", 32, 96)}
PRESET_SFT_STEPS = 60
# Identity of a run for `--resume` (CheckpointConfig.identity): what is trained, and on what;
# recorded under short keys, as checkpoints written before the config tree recorded them.
IDENTITY = {
    "model": "model.name", "algo": "train.algo", "task": "task.name", "task_args": "task.args",
    "reward": "task.reward", "group_size": "loop.group_size",
    "prompts_per_step": "loop.prompts_per_step", "mode": "loop.mode",
    "max_staleness": "loop.max_staleness", "max_new_tokens": "loop.max_new_tokens",
    "max_prompt_len": "loop.max_prompt_len", "temperature": "loop.temperature",
    "kl_coef": "train.kl_coef", "seed": "loop.seed", "chat_template": "model.chat_template",
    "oversample": "loop.oversample", "skip_nonfinite": "optim.skip_nonfinite",
    "param_dtype": "precision.param_dtype", "compute_dtype": "precision.compute_dtype",
    "rollout_dtype": "precision.rollout_dtype", "behav_weight_cap": "train.behav_weight_cap",
    **{f"lora.{k}": f"lora.{k}" for k in ("rank", "alpha", "targets", "dropout")}}


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
  """Built objects: the config with its defaults filled in, the mesh's shape, the model
  (config in the training dtypes, tokenizer, params or None), the training task (reward
  failures counted), the run's plan, the checkpoint config (with the run's identity), the
  held-out task and its problem indices, notes (e.g. prompts dropped for length; shown when
  the run starts)."""
  config: RunConfig
  mesh_spec: MeshSpec
  model: LoadedModel
  task: Any
  plan: RunPlan
  checkpoint: CheckpointConfig
  eval_task: Any = None
  eval_indices: tuple[int, ...] = ()
  notes: list[str] = dataclasses.field(default_factory=list)
  env_factory: Any = None
  turn_format: Any = None

  @property
  def agentic(self) -> bool:
    """Multi-turn episodes (an env: `--env`, or the task's own)."""
    return self.env_factory is not None

  @property
  def agent(self) -> AgentConfig:
    """The episodes' settings (`config.agent`)."""
    return self.config.agent

  @property
  def train(self) -> TrainConfig:
    """The step's config (`plan.train`)."""
    return self.plan.train

  @property
  def loop(self) -> LoopConfig:
    """The loop's settings, lengths filled in (`plan.loop`)."""
    return self.plan.loop

  @property
  def rollout(self) -> RolloutSetup:
    """Where rollout runs (`config.rollout`)."""
    return self.config.rollout


def _build_task(rc: RunConfig, task_args: dict) -> Any:
  if parse_task_spec(rc.task.name) is not None:
    task_args.setdefault("seed", rc.loop.seed)
  return make_task(rc.task.name, rc.task.reward, **task_args)


def _fit_dataset(task: DatasetTask, model: LoadedModel, rc: RunConfig
                 ) -> tuple[DatasetTask, int, int, str | None]:
  """(task without the prompts longer than the bucket, prompt bucket, response budget, a note
  on the dropped rows or None); see `recipe.limits` for the default bucket."""
  tok = model.tokenizer
  new_tokens = rc.loop.max_new_tokens
  if new_tokens is None:
    new_tokens = 64
    if task.has_answers:
      new_tokens = max(4, max(len(tok.encode(str(r[task.answer_key]))) for r in task.rows) + 3)
  prompts = [row[task.prompt_key] for row in task.rows]
  lengths = [len(tok.encode(p, bos=True)) for p in prompts]
  context = None if model.is_preset else model.config.max_seq_len - new_tokens
  max_len = rc.loop.max_prompt_len
  if max_len is None:
    max_len = limits.default_prompt_len(lengths, context)
  note = limits.check_dropped(prompts, lengths, max_len, "--max_prompt_len")
  if note:
    task = task.select([i for i, n in enumerate(lengths) if n <= max_len])
  return task, max_len, new_tokens, note


def build_recipe(rc: RunConfig | RecipeConfig, *, task: Any = None) -> Recipe:
  """Validates `rc`, fills its defaults and builds its pieces (no JAX computation, no mesh).

  Args:
    rc: the config (a `RecipeConfig`, the flat façade, is turned into its tree).
    task: a task object to use instead of `rc.task` (anything with `problem(i) -> Problem`
      and `reward(problem, completion) -> float`; see `tasks.DatasetTask`).

  Raises:
    ValueError: with a message naming the bad input (mesh string, algorithm, group size,
      prompt longer than the context, unknown model or task, missing model files, a reward
      that cannot be imported, out-of-range numbers, output paths that are files).
  """
  rc = rc.run_config() if isinstance(rc, RecipeConfig) else rc
  spec = parse_mesh(rc.distributed.mesh)
  precision = rc.precision.resolve()  # "auto" -> this backend's dtypes, recorded as resolved
  rc = dataclasses.replace(rc, precision=precision)
  limits.check_fake_devices(spec.size, max(len(jax.devices()), len(backend.cpu_devices())),
                            backend.platform())
  for path in (rc.output.out_dir, rc.checkpoint.directory, rc.output.export_hf,
               rc.output.export_peft):
    if path:
      check_directory_path(path, {rc.output.out_dir: "--out_dir", rc.output.export_hf:
                                  "--export_hf", rc.output.export_peft: "--export_peft"
                                  }.get(path, "--checkpoint_dir"))
  if task is not None:  # a Python task object: recorded by name (not reproducible from a file)
    rc = rc.replace(**{"task.name": str(getattr(task, "name", type(task).__name__)),
                       "task.args": ""})
  defaults = TASK_DEFAULTS.get(rc.task.name, ("", None, None))
  task_args = defaults[0] if rc.task.args is None else rc.task.args
  if task is None:
    task = _build_task(rc, parse_task_args(task_args))
  dataset = isinstance(task, DatasetTask)
  env_factory = _env_factory(rc, task)
  extra = ("".join(task.texts()) if dataset else "") + getattr(task, "alphabet", "")
  extra += _env_chars(env_factory)
  model = load_model(rc.model.name, max_seq_len=64, chat_template=rc.model.chat_template,
                     extra_chars=extra)
  prompt_len, new_tokens = defaults[1:]
  notes = []
  if dataset:
    task, prompt_len, new_tokens, note = _fit_dataset(task, model, rc)
    notes += [n for n in (note, unknown_characters_note(task, model.tokenizer)) if n]
    if env_factory is not None and rc.loop.max_new_tokens is None:
      new_tokens = max(new_tokens, 32 * rc.agent.max_turns)  # turns and observations
  n_eval = rc.eval.prompts
  eval_task, eval_indices = task, tuple(range(SYNTHETIC_EVAL_START, SYNTHETIC_EVAL_START + n_eval))
  if dataset and rc.eval.every:
    task, eval_task = task.split(n_eval)
    eval_indices = tuple(range(n_eval))
  pick = lambda given, default: given if given is not None else (default or 16)  # noqa: E731
  rc = rc.replace(**{"task.args": task_args,
                     "loop.max_prompt_len": pick(rc.loop.max_prompt_len, prompt_len),
                     "loop.max_new_tokens": pick(rc.loop.max_new_tokens, new_tokens)})
  if model.is_preset:
    model.config = dataclasses.replace(model.config, max_seq_len=rc.loop.seq_len)
  model.config = dataclasses.replace(precision.train_model(model.config), lora=rc.lora)
  if model.config.lora is not None:
    lora.target_paths(model.config)  # a target the model lacks fails here, before any work
  # float32 by default: a cast to the checkpoint's bfloat16 would round most of an RL update away
  rc = rc.replace(**{"precision.export_dtype": rc.precision.export_dtype or "float32"})
  for flag in ("export_hf", "export_peft"):
    if rc.get(f"output.{flag}") and model.is_preset and model.config.moe is not None:
      raise ValueError(f"--{flag} with --model={rc.model.name}: the tiny MoE preset has no "
                       "Hugging Face equivalent (aux-free routing biases, no q/k norms); export "
                       "works for the dense preset and for Hugging Face models")
  if rc.output.export_peft:
    from jaxrl_sys.models.hf.peft import check_peft_targets  # pylint: disable=import-outside-toplevel
    check_peft_targets(model.config)
  has_answers = getattr(task, "has_answers", True)
  if rc.warmup.steps is None:
    rc = rc.replace(**{"warmup.steps": PRESET_SFT_STEPS if model.is_preset and has_answers
                       else 0})
  elif rc.warmup.steps and not has_answers:
    raise ValueError(f"--sft_steps={rc.warmup.steps}: the supervised warm-up trains on "
                     "reference answers, and the task's rows have none; pass --sft_steps=0")
  plan = RunPlan.derive(model.config, rc.train.train_config(rc.optim, rc.loop), rc.loop,
                        rc.precision, model.tokenizer.eos_id, mesh=spec,
                        processes=jax.process_count())
  if plan.processes > 1 and rc.rollout.rollout != "local":
    raise ValueError(f"rollout.rollout={rc.rollout.rollout} with {plan.processes} processes: a "
                     "multi-process run uses each process's own co-located engine; use "
                     "rollout.rollout=local (Ray rollout is single-process only)")
  limits.check_memory(model.config, min(rc.loop.micro_batch_groups, rc.loop.prompts_per_step)
                      * plan.samples_per_group, plan.seq_len, jax.devices()[0])
  fmt = None
  if env_factory is not None:
    fmt = turn_format(model.tokenizer)
    # Episodes: turns stop on the template's end-of-turn ids; an episode's next turn extends
    # the KV its previous turn left in its engine (sticky sessions); decode chunks of at most 4
    # steps, so an episode back from its tool joins the engine sooner (docs/agents.md).
    engine = dict(extend_prefixes=True, stream_every=min(4, plan.engine.stream_every),
                  sampling=dataclasses.replace(plan.engine.sampling, stop_tokens=fmt.stop_ids))
    plan = dataclasses.replace(plan, engine=dataclasses.replace(plan.engine, **engine),
                               eval_engine=dataclasses.replace(plan.eval_engine, **engine))
  encode_prompt(model.tokenizer, task.problem(0).prompt, rc.loop.max_prompt_len)  # fail early
  identity = {key: rc.get(path) for key, path in IDENTITY.items()}
  identity.update(kl_coef=plan.train.loss.kl_coef,
                  eval_split=n_eval if dataset and rc.eval.every else 0)
  if env_factory is not None:
    identity.update(env=rc.agent.env, max_turns=rc.agent.max_turns,
                    max_turn_tokens=rc.agent.max_turn_tokens)
  ckpt = dataclasses.replace(rc.checkpoint, identity=json.loads(json.dumps(identity)))
  return Recipe(rc, spec, model, CountingTask(task), plan, ckpt, eval_task, eval_indices, notes,
                env_factory, fmt)


def _env_factory(rc: RunConfig, task: Any) -> Any:
  """The per-episode env factory: `--env=module:Class` (called with the task when its
  constructor takes one), the task's own `make_env`, or None (single-turn training)."""
  if rc.agent.env:
    cls = load_env(rc.agent.env)
    return lambda: call_env_factory(cls, task)
  return getattr(task, "make_env", None)


def _env_chars(env_factory: Any) -> str:
  """Characters a preset's character tokenizer needs for an env's episodes: its `alphabet`,
  its call markers and tool names, and the newlines around observations."""
  if env_factory is None:
    return ""
  env = env_factory()
  parser = getattr(env, "parser", None)
  out = getattr(env, "alphabet", "") + " \n?"
  if parser is not None:
    out += parser.open + parser.close + "".join(t.name for t in getattr(env, "tools", ()))
  return out


def agent_driver(recipe: Recipe, session: RolloutSession, *, check_template: bool = True):
  """`agents.EpisodeDriver` over `session` for the recipe's env (it owns and closes the
  session)."""
  from jaxrl_sys.agents.driver import EpisodeDriver  # pylint: disable=import-outside-toplevel
  config = recipe.agent if check_template else dataclasses.replace(recipe.agent,
                                                                   check_template=False)
  return EpisodeDriver(session, recipe.env_factory, recipe.task, recipe.turn_format, config,
                       close_session=True)


# The evaluation always generates in-process, whatever runs the training rollout.
_IN_PROCESS = RolloutSetup()


def rollout_session(recipe: Recipe, *, warmup: bool = False, clock: Clock = WALL,
                    message: Callable[[str], None] | None = None) -> RolloutSession:
  """The training rollout session of `recipe` (`make_client`: in-process engines, or Ray
  workers with `--rollout=ray`), with no weights yet; the caller closes it.

  Args:
    recipe: from `build_recipe`.
    warmup: compile every prefill / decode shape of the in-process engines before the first
      request (no compilation stalls mid-run; slower start).
    clock: the session's time source.
    message: prints the Ray fleet's lines (kills, joins, migrations).
  """
  plan = recipe.plan
  options = ClientOptions(local_workers=plan.loop.local_workers, warmup=warmup,
                          seed=plan.loop.seed,
                          compile_cache=jax.config.jax_compilation_cache_dir or None,
                          message=message)
  session = make_client(recipe.rollout, plan.rollout_model, plan.engine, options=options,
                        clock=clock)
  return agent_driver(recipe, session) if recipe.agentic else session


def eval_session(recipe: Recipe) -> RolloutSession:
  """The evaluation's rollout session: in-process engines sized for `plan.eval_samples` per
  problem, running the policy in its training dtypes; the caller closes it."""
  plan = recipe.plan
  session = make_client(_IN_PROCESS, plan.train_model, plan.eval_engine,
                        options=ClientOptions(local_workers=plan.loop.local_workers))
  return agent_driver(recipe, session, check_template=False) if recipe.agentic else session


def make_loop(recipe: Recipe, mesh: jax.sharding.Mesh, client: RolloutSession,
              **kwargs) -> RLLoop:
  """The `RLLoop` of `recipe` on `mesh` over `client`: the plan, the jitted step
  (`train_programs`, shared by equal configurations in a process), the task and tokenizer;
  `kwargs` go to `RLLoop` (init_params, checkpoint, resume, out_dir, progress, clock,
  step_hooks, resumables)."""
  plan = recipe.plan
  programs = train_programs(plan.train_model, plan.train, plan.precision.param_dtype, mesh,
                            DEFAULT_RULES, plan.engine.sampling)
  return RLLoop(plan, programs, client, recipe.task, recipe.model.tokenizer, **kwargs)


