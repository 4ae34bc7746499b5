"""Logical axis names: the one vocabulary of `param_axes`, batch shardings and the rules table.

Arrays are annotated with these names (never with mesh axes); `rules.DEFAULT_RULES` maps each
to a mesh axis. Use the constants, not string literals, so a rename or a typo shows up at
import time.
"""
BATCH = "batch"            # rows of a batch (data parallel)
EMBED = "embed"            # model width D of weights (FSDP over "data")
VOCAB = "vocab"            # vocabulary V
HEADS = "heads"            # query heads
KV_HEADS = "kv_heads"      # key / value heads
HEAD_DIM = "head_dim"      # per-head width
MLP = "mlp"                # dense MLP hidden width F
EXPERT = "expert"          # MoE experts E (expert parallelism over "model")
EXPERT_MLP = "expert_mlp"  # an expert's hidden width
LAYERS = "layers"          # the stacked (scanned) layer dimension
NORM = "norm"              # norm scales

ALL = (BATCH, EMBED, VOCAB, HEADS, KV_HEADS, HEAD_DIM, MLP, EXPERT, EXPERT_MLP, LAYERS, NORM)
