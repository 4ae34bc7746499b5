"""The weights an `Engine` runs: the policy's parameters, its MoE balancing state and, with LoRA,
the frozen base beside the adapters.

`EngineWeights` validates every load against the first one (same tree, shapes and dtypes: a
different shape would recompile every slot function) and gives the slot functions the pair
`run = (parameters, adapters)` they take: `(params, None)` without LoRA, `(base, adapters)`
unmerged (`x @ W + s (x @ A) @ B`, no rounding of the update into the base), or
`(merge(base, adapters), None)` with `LoraConfig.merge` (merged once per version, in the base's
dtype: faster decode, the update rounded into bf16 weights).
"""
from __future__ import annotations

from typing import Any

import jax

from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.models.config import ModelConfig


def _shapes(tree) -> Any:
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


class EngineWeights:
  """The engine's current weights.

  Attributes:
    params: the model's parameters; with LoRA (`model_config.lora`) the adapters
      (`models.lora.init_lora` layout).
    moe_state: the MoE balancing state (`models.moe.MoEState`; zeros when none was given), or
      None for a dense model.
    base: with LoRA the frozen base parameters the adapters apply to, else None.
    run: `(parameters, adapters)` the slot functions take (see the module docstring).
  """

  def __init__(self, model_config: ModelConfig, params: Any, moe_state: Any = None,
               base: Any = None):
    if (model_config.lora is None) != (base is None):
      raise ValueError("Engine: with LoRA (model_config.lora) give the adapters as params and "
                       "the frozen base as base=; without LoRA give no base")
    if base is not None:
      lora_lib.check_lora(model_config, params)
    self.model_config = model_config
    self.params, self.moe_state, self.base = params, self._moe_state(moe_state), base
    self._param_shapes = _shapes((params, self.moe_state))
    self._base_shapes = None if base is None else _shapes(base)
    self.run = self._run()

  def _moe_state(self, moe_state: Any) -> Any:
    if self.model_config.moe is None:
      if moe_state is not None:
        raise ValueError("moe_state given for a dense model (model_config.moe is None)")
      return None
    if moe_state is None:
      from jaxrl_sys.models.moe import block as moe  # pylint: disable=import-outside-toplevel
      return moe.init_moe_state(self.model_config)
    return moe_state

  def _run(self) -> tuple[Any, Any]:
    if self.base is None:
      return self.params, None
    if self.model_config.lora.merge:
      return lora_lib.merge_lora(self.base, self.params, config=self.model_config), None
    return self.base, self.params

  def load(self, params: Any, moe_state: Any = None, base: Any = None) -> None:
    """Replaces the weights (same structure, shapes and dtypes as the first ones); with LoRA a
    new `base` replaces the frozen base (None: keep it). Raises ValueError on a mismatch, with
    the engine's weights unchanged."""
    moe_state = self._moe_state(moe_state)
    if _shapes((params, moe_state)) != self._param_shapes:
      raise ValueError("load: params differ in structure, shape or dtype from the "
                       "engine's (this would recompile every function)")
    if base is not None and (self.base is None or _shapes(base) != self._base_shapes):
      raise ValueError("load: the base differs in structure, shape or dtype from the "
                       "engine's (or the engine runs no LoRA model)")
    if base is not None:
      self.base = base
    self.params, self.moe_state = params, moe_state
    self.run = self._run()
