"""The model directory: the one place a trained model lives.

layout.py's `ModelDir` owns every path of the contract and its small files
(config.json, vocabularies, best/'s record, init_from.json); loading.py builds
the model and restores, averages or casts its weights.
"""

from tf_transformer.model_dir.layout import (BEST, BEST_DIR, CONFIG_FILE, INIT_FROM_FILE,
                                             RECORD_FILE, SOURCE_VOCAB_FILE, TARGET_VOCAB_FILE,
                                             VOCAB_FILE, ModelDir)
from tf_transformer.model_dir.loading import (LoadedModel, average_into, cast_weights,
                                              load_model, write_averaged)

__all__ = ["BEST", "BEST_DIR", "CONFIG_FILE", "INIT_FROM_FILE", "RECORD_FILE",
           "SOURCE_VOCAB_FILE", "TARGET_VOCAB_FILE", "VOCAB_FILE", "LoadedModel", "ModelDir",
           "average_into", "cast_weights", "load_model", "write_averaged"]
