"""Pull-based weight stores: the protocols (`base`), chunked checksummed I/O (`io`), the stores
(`MemoryWeightStore`; `tensorstore`, `ray` imported on demand) and `make_weight_store`."""
from jaxrl_sys.rollout.weights.base import (CorruptWeightsError, MemoryWeightStore,
                                            WeightPublishError, WeightRef, WeightStore,
                                            make_weight_store)

__all__ = ["CorruptWeightsError", "MemoryWeightStore", "WeightPublishError", "WeightRef",
           "WeightStore", "make_weight_store"]
