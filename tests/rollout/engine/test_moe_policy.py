"""An MoE policy's balancing state (routing biases) reaches the rollout engine, through the
in-process session the factory builds (`rollout.setup.factory.make_client`)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys import models
from jaxrl_sys.models.moe import block as moe
from jaxrl_sys.rollout import Engine, Request, request_key
from jaxrl_sys.rollout.setup.factory import make_client
from jaxrl_sys.rollout.setup.spec import RolloutSetup
from tests.rollout.common import CFG, GREEDY, engine_config
from tests.rollout.common import params as dense_params

MOE_CFG = models.ModelConfig(
    vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
    intermediate_size=64, max_seq_len=64,
    moe=models.MoEConfig(num_experts=4, num_experts_per_tok=1, expert_intermediate_size=32,
                         balancing="aux_free"))


def _setup():
  params = models.init_params(MOE_CFG, jax.random.PRNGKey(0))
  params = jax.tree_util.tree_map(lambda x: x * 3.0 if x.ndim > 1 else x, params)
  bias = 2.0 * jax.random.normal(jax.random.PRNGKey(1), (MOE_CFG.num_layers, 4))
  state = moe.init_moe_state(MOE_CFG)._replace(bias=bias)
  rng = np.random.default_rng(0)
  reqs = [Request(i, rng.integers(1, 48, size=int(rng.integers(2, 7))), 6, request_key(0, i))
          for i in range(4)]
  return params, state, reqs


_REF_LEN = 16  # prompts of at most 6 tokens + 6 new ones; causal, so right padding is inert


@jax.jit
def _next_token(params, state, tokens, last):
  hidden = models.forward(params, MOE_CFG, tokens[None], moe_state=state).hidden
  return jnp.argmax(models.logits_from_hidden(params, MOE_CFG, hidden[0, last]))


def greedy_by_recompute(params, state, prompt, n):
  """Independent reference: a full forward over the sequence so far for every new token (one
  compiled shape: the sequence right-padded to a fixed length)."""
  seq = list(int(t) for t in prompt)
  for _ in range(n):
    buf = np.zeros(_REF_LEN, np.int32)
    buf[:len(seq)] = seq
    seq.append(int(_next_token(params, state, jnp.asarray(buf), len(seq) - 1)))
  return seq[len(prompt):]


def _run(client, reqs):
  client.submit(reqs)
  done = {}
  while len(done) < len(reqs):
    for c in client.poll(min_count=len(reqs) - len(done)):
      done[c.request_id] = [int(t) for t in c.request.tokens]
  return done


def test_engine_routes_with_the_published_moe_state():
  params, state, reqs = _setup()
  ref = {r.request_id: greedy_by_recompute(params, state, r.prompt, 6) for r in reqs}
  ref_zero = {r.request_id: greedy_by_recompute(params, None, r.prompt, 6) for r in reqs}
  assert ref != ref_zero, "the routing bias must change the greedy continuations"
  cfg = engine_config(GREEDY)
  client = make_client(RolloutSetup(), MOE_CFG, cfg)
  try:
    client.publish(params, 0, state)
    assert _run(client, reqs) == ref
    # Publishing zero biases switches the routing back.
    client.publish(params, 1, moe.init_moe_state(MOE_CFG))
    again = [Request(r.request_id + 10, r.prompt, 6, r.key, min_version=1) for r in reqs]
    assert _run(client, again) == {k + 10: v for k, v in ref_zero.items()}
  finally:
    client.close()
  # models.generate takes the same state.
  out = models.generate(params, MOE_CFG, np.asarray([reqs[0].prompt], np.int32),
                        sampling=models.SamplingConfig(temperature=0.0, max_new_tokens=6),
                        moe_state=state)
  assert [int(t) for t in out.tokens[0]] == ref[0]


def test_moe_state_for_a_dense_model_is_rejected():
  with pytest.raises(ValueError, match="dense model"):
    Engine(CFG, dense_params(), engine_config(GREEDY), moe_state=moe.init_moe_state(MOE_CFG))
