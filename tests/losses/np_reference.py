"""Independent plain-NumPy (float64) implementations of spec/algorithms.md, for the tests.

Written from the formulas of the spec, deliberately in a different style from the JAX code
(loops over groups and rows, the `min` form of the clipped surrogate).
"""
import numpy as np


def group_advantages(rewards, group_size, *, baseline="mean", scale="std", eps=1e-6, ddof=1,
                     mad_guard=True):
  """Returns (advantages, mask, zero_variance_count), flat [N]."""
  r = np.asarray(rewards, np.float64).reshape(-1)
  adv = np.zeros_like(r)
  mask = np.ones_like(r)
  n_zero = 0
  for start in range(0, r.size, group_size):
    g = r[start:start + group_size]
    if np.all(g == g[0]):
      n_zero += 1
    if baseline == "mean":
      b = g.mean()
    else:
      b = np.sort(g)[(len(g) - 1) // 2]
      mask[start + int(np.flatnonzero(g == b)[0])] = 0.0
    if np.all(g == g[0]):
      continue  # exactly 0
    if scale == "none":
      a = g - b
    elif scale == "std":
      a = (g - b) / (np.std(g, ddof=ddof) + eps)
    else:
      mad = np.sort(np.abs(g - b))[(len(g) - 1) // 2]
      a = (g - b) / (1.0 if (mad == 0 and mad_guard) else mad + eps)
    adv[start:start + group_size] = a
  return adv, mask, n_zero


def kl(lp, ref, estimator, clamp=None):
  log_r = ref - lp
  if clamp is not None:
    log_r = np.clip(log_r, -clamp, clamp)
  if estimator == "k1":
    return -log_r
  if estimator == "k2":
    return 0.5 * log_r ** 2
  return np.exp(log_r) - 1 - log_r


def aggregate(per_token, mask, mode, constant_length=None):
  """Returns (numerator, denominator) of the spec's aggregation table (empty rows excluded)."""
  m = mask.astype(bool)
  rows = [i for i in range(m.shape[0]) if m[i].any()]
  if mode == "token_mean":
    return float(np.sum(per_token[m])), float(m.sum())
  if mode == "seq_mean_token_mean":
    num = sum(np.sum(per_token[i][m[i]]) / m[i].sum() for i in rows)
    return float(num), float(len(rows))
  num = sum(np.sum(per_token[i][m[i]]) for i in rows)
  if mode == "seq_mean_token_sum":
    return float(num), float(len(rows))
  c = per_token.shape[1] if constant_length is None else constant_length
  return float(num), float(len(rows) * c)


def policy_loss(lp, old, adv, mask, *, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip_c=None,
                kl_coef=0.0, kl_estimator="k3", kl_where="loss", ref=None, entropy=None,
                entropy_coef=0.0, behav=None, behav_weight_cap=None,
                behav_weight_cap_mode="clamp", aggregation="seq_mean_token_mean",
                drgrpo_constant_length=None, logratio_clamp=20.0, decoupled=False,
                old_policy="proximal"):
  """Returns (loss, numerator, denominator, metrics) in float64. `old_policy` (which log-probs
  the train step passes as `old`) is the caller's choice: `old` is used as given."""
  del old_policy
  lp, old = np.asarray(lp, np.float64), np.asarray(old, np.float64)
  adv = np.asarray(adv, np.float64)
  if adv.ndim == 1:
    adv = np.repeat(adv[:, None], lp.shape[1], axis=1)
  m = np.asarray(mask).astype(bool)
  ratio = np.exp(np.clip(lp - old, -logratio_clamp, logratio_clamp))
  surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - clip_eps_low, 1 + clip_eps_high) * adv)
  pg = -surrogate
  if dual_clip_c is not None:
    pg = np.where(adv < 0, np.minimum(pg, -dual_clip_c * adv), pg)
  metrics = {}
  if behav is not None:
    w = np.exp(np.clip(old - np.asarray(behav, np.float64), -logratio_clamp, logratio_clamp))
    if behav_weight_cap is not None:
      w = np.minimum(w, behav_weight_cap) if behav_weight_cap_mode == "clamp" else np.where(
          w > behav_weight_cap, 0.0, w)
    pg = w * pg
    metrics["behav_weight_mean"] = w[m].mean()
    rows = m.any(-1)
    metrics["ess"] = ess(np.sum(np.where(m, lp - np.asarray(behav, np.float64), 0), -1)[rows])
  per_token = pg.copy()
  if ref is not None:
    k = kl(lp, np.asarray(ref, np.float64), kl_estimator, logratio_clamp)
    metrics["kl"] = k[m].mean()
    if kl_where == "loss":
      per_token = per_token + kl_coef * k
  if entropy is not None:
    per_token = per_token - entropy_coef * np.asarray(entropy, np.float64)
    metrics["entropy"] = np.asarray(entropy, np.float64)[m].mean()
  num, den = aggregate(per_token, m, aggregation, drgrpo_constant_length)
  pg_num, _ = aggregate(pg, m, aggregation, drgrpo_constant_length)
  metrics["pg_loss"] = pg_num / den
  metrics["clip_frac_low"] = ((adv < 0) & (ratio < 1 - clip_eps_low))[m].mean()
  metrics["clip_frac_high"] = ((adv > 0) & (ratio > 1 + clip_eps_high))[m].mean()
  log_ratio = lp - old
  metrics["approx_kl"] = (np.exp(log_ratio) - 1 - log_ratio)[m].mean()
  return num / den, num, den, metrics


def ess(log_weights):
  """Spec formula in linear space: (sum w)^2 / (sum w^2 + 1e-8)."""
  w = np.exp(np.asarray(log_weights, np.float64))
  return w.sum() ** 2 / (np.sum(w ** 2) + 1e-8)


def opob(rewards, sq_norms, weights, group_size):
  """Per-sample baseline b_g = sum W R / sum W, W = w^2 ||g||^2; and the VCPO advantages."""
  r = np.asarray(rewards, np.float64)
  big_w = np.asarray(weights, np.float64) ** 2 * np.asarray(sq_norms, np.float64)
  base = np.zeros_like(r)
  adv = np.zeros_like(r)
  for s in range(0, r.size, group_size):
    sl = slice(s, s + group_size)
    base[sl] = np.sum(big_w[sl] * r[sl]) / np.sum(big_w[sl])
    sigma = np.std(r[sl])
    adv[sl] = (r[sl] - base[sl]) / (sigma if sigma > 1e-8 else 1.0)
  return base, adv
