"""Shared tiny model, request factories and the plain-sampler reference for rollout tests."""
import functools

import numpy as np

import jax

from jaxrl_sys import models
from jaxrl_sys.rollout import EngineConfig, Request, request_key

CFG = models.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                         head_dim=16, intermediate_size=64, max_seq_len=64)
MAX_NEW = 12
SAMPLED = models.SamplingConfig(temperature=1.0, top_p=0.9)
GREEDY = models.SamplingConfig(temperature=0.0)


@functools.lru_cache(maxsize=None)
def params(seed: int = 0):
  return models.init_params(CFG, jax.random.PRNGKey(seed))


def engine_config(sampling=SAMPLED, **kw) -> EngineConfig:
  """The tests' engine: 3 slots, 32-token context. Sampling modes other than SAMPLED get a
  single decode shape (rows 3, width 32) to compile less."""
  if sampling != SAMPLED:
    kw = dict(dict(decode_row_buckets=(3,), decode_len_buckets=(32,)), **kw)
  base = dict(num_slots=3, max_len=32, prefill_buckets=(16, 32), prefill_batch_buckets=(4,),
              decode_row_buckets=(2, 3), decode_len_buckets=(16, 32), stream_every=3,
              sampling=sampling)
  base.update(kw)
  return EngineConfig(**base)


def make_requests(n: int, seed: int = 0, group: int = 1, first_id: int = 0) -> list[Request]:
  """n requests; `group` consecutive requests share a prompt and group id (GRPO-style)."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    if i % group == 0:
      prompt = rng.integers(1, CFG.vocab_size, size=int(rng.integers(1, 9)))
    rid = first_id + i
    out.append(Request(rid, prompt, int(rng.integers(1, MAX_NEW + 1)), request_key(seed, rid),
                       group_id=first_id + i // group))
  return out


def reference(reqs, sampling, p=None):
  """{request_id: (tokens, logprobs)} from `models.generate` with keys = request keys.

  Prompts are left-padded into fixed `[16, 24]` blocks (one compile per sampling mode); the
  output is cut to each request's budget and after its first stop token (what generate does
  with stop tokens, since a token's randomness depends only on its key and index).
  """
  p = params() if p is None else p
  s = models.SamplingConfig(temperature=sampling.temperature, top_k=sampling.top_k,
                            top_p=sampling.top_p, max_new_tokens=MAX_NEW)
  res = {}
  for i0 in range(0, len(reqs), 16):
    part = reqs[i0:i0 + 16]
    toks = np.zeros((16, 24), np.int32)
    mask = np.zeros((16, 24), np.int32)
    keys = np.zeros((16, 2), np.uint32)
    for i, r in enumerate(part):
      toks[i, 24 - len(r.prompt):], mask[i, 24 - len(r.prompt):], keys[i] = r.prompt, 1, r.key
    mask[len(part):, -1] = 1
    out = models.generate(p, CFG, toks, mask, keys=keys, sampling=s)
    out_t, out_l = np.asarray(out.tokens), np.asarray(out.logprobs)
    for i, r in enumerate(part):
      n = r.max_new_tokens
      hits = np.flatnonzero(np.isin(out_t[i, :n], sampling.stop_tokens))
      n = hits[0] + 1 if len(hits) else n
      res[r.request_id] = (out_t[i, :n], out_l[i, :n])
  return res


def assert_matches(completions, ref, atol=1e-5):
  got = {c.request_id: c.request for c in completions}
  assert set(got) == set(ref)
  for rid, (toks, lps) in ref.items():
    np.testing.assert_array_equal(got[rid].tokens, toks, err_msg=f"request {rid}")
    np.testing.assert_allclose(got[rid].logprobs, lps, atol=atol, err_msg=f"request {rid}")
