"""fused_logprobs: XLA path vs naive, Pallas (interpret) vs XLA, memory, jit/vmap/shard_map."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_sys.kernels import fused_logprobs
from tests.kernels.helpers import assert_close, jit
from tests.precision_helpers import needs_devices

TEMP = 0.7
BLOCKS = dict(block_tokens=16, block_vocab=32, block_d=16)


def naive(hidden, unembed, targets, temperature=TEMP):
  """Independent: full logits, log_softmax, gather, entropy."""
  logits = hidden.astype(jnp.float32) @ unembed.astype(jnp.float32) / temperature
  logp = jax.nn.log_softmax(logits)
  lp = logp[jnp.arange(targets.shape[0]), targets]
  return lp, -(jax.nn.softmax(logits) * logp).sum(-1)


def inputs(keys, tokens=37, d=20, vocab=150, dtype=jnp.float32):
  hidden = jax.random.normal(keys[0], (tokens, d), dtype)
  unembed = (jax.random.normal(keys[1], (d, vocab)) * 0.5).astype(dtype)
  targets = jax.random.randint(keys[2], (tokens,), 0, vocab)
  return hidden, unembed, targets


@functools.partial(jit, static_argnums=0)
def value_and_grads(f, hidden, unembed, targets):
  """Both outputs with distinct weights, so entropy gradients are exercised too."""
  w1 = jnp.linspace(-1.0, 1.0, targets.shape[0])
  w2 = jnp.cos(jnp.arange(targets.shape[0], dtype=jnp.float32))

  def loss(h, w):
    lp, ent = f(h, w, targets)
    return jnp.sum(lp * w1) + jnp.sum(ent * w2), (lp, ent)

  (_, outs), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(hidden, unembed)
  return outs, grads


@pytest.mark.parametrize("chunk", [64, 150])  # ragged tail; one exact chunk
def test_xla_matches_naive(keys, chunk):
  args = inputs(keys)
  fused = functools.partial(fused_logprobs, temperature=TEMP, chunk_size=chunk, impl="xla")
  assert_close(value_and_grads(fused, *args), value_and_grads(naive, *args), scale=10.0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pallas_matches_xla(keys, dtype):
  args = inputs(keys, dtype=dtype)
  xla = functools.partial(fused_logprobs, temperature=TEMP, chunk_size=64, impl="xla")
  pallas = functools.partial(fused_logprobs, temperature=TEMP, impl="pallas", **BLOCKS)
  assert_close(value_and_grads(pallas, *args), value_and_grads(xla, *args), dtype, scale=10.0)
  if dtype == jnp.bfloat16:  # and the f32 naive on the same bf16 values
    assert_close(pallas(*args), naive(*args), dtype, scale=10.0)


def test_memory_is_chunked():
  """Compiled temp memory of value+grad: fused XLA path far below full logits."""
  tokens, d, vocab, chunk = 256, 64, 8192, 512
  specs = (jax.ShapeDtypeStruct((tokens, d), jnp.float32),
           jax.ShapeDtypeStruct((d, vocab), jnp.float32),
           jax.ShapeDtypeStruct((tokens,), jnp.int32))

  def temp_bytes(f):
    def vg(h, w, y):
      return jax.value_and_grad(lambda h, w: sum(o.sum() for o in f(h, w, y)), (0, 1))(h, w)
    return jax.jit(vg).lower(*specs).compile().memory_analysis().temp_size_in_bytes

  naive_temp = temp_bytes(naive)
  fused_temp = temp_bytes(functools.partial(fused_logprobs, chunk_size=chunk, impl="xla"))
  assert naive_temp >= tokens * vocab * 4  # at least one [tokens, vocab] f32 buffer
  assert naive_temp / fused_temp >= 8, (naive_temp, fused_temp)


def test_jit_and_vmap(keys):
  hidden, unembed, targets = inputs(keys, tokens=12, vocab=70)
  hb = jnp.stack([hidden, -hidden])
  yb = jnp.stack([targets, targets[::-1]])
  expected = jax.vmap(lambda h, y: naive(h, unembed, y))(hb, yb)
  f = jit(jax.vmap(lambda h, y: fused_logprobs(h, unembed, y, temperature=TEMP,
                                                    impl="pallas", **BLOCKS)))
  assert_close(f(hb, yb), expected, scale=10.0)


@needs_devices(4)
@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_shard_map_tokens_sharded(keys, impl):
  mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  hidden, unembed, targets = inputs(keys, tokens=32, vocab=70)
  f = functools.partial(fused_logprobs, temperature=TEMP, chunk_size=32, impl=impl, **BLOCKS)
  sharded = jax.shard_map(lambda h, w, y: f(h, w, y), mesh=mesh,
                          in_specs=(P("data"), P(), P("data")), out_specs=P("data"),
                          check_vma=False)
  put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
  args = (put(hidden, P("data")), put(unembed, P()), put(targets, P("data")))
  expected = value_and_grads(naive, hidden, unembed, targets)
  with jax.set_mesh(mesh):
    got = value_and_grads(jax.jit(sharded), *args)
  assert_close(jax.tree.map(np.asarray, got), expected, scale=10.0)
