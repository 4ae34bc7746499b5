"""Pull-based weight stores: the protocols and errors (`base`), chunked checksummed I/O (`io`),
the stores (`memory`; `tensorstore`, over `kvstore`'s deadline-bound kvstore access, and `ray`
imported on demand) and `make_weight_store` (`factory`, backends looked up by name)."""
from jaxrl_sys.rollout.weights.base import (BaseRef, BaseWeights, CorruptWeightsError,
                                            VersionTable, WeightPublishError, WeightRef,
                                            WeightStore)
from jaxrl_sys.rollout.weights.factory import make_weight_store
from jaxrl_sys.rollout.weights.memory import MemoryWeightStore

__all__ = ["BaseRef", "BaseWeights", "CorruptWeightsError", "MemoryWeightStore", "VersionTable",
           "WeightPublishError", "WeightRef", "WeightStore", "make_weight_store"]
