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
           "average_into", "cast_weights", "load_model", "write_averaged",
           "best_summary", "prepare_model_dir"]


# train.py's two calls, until it holds a ModelDir (issue 45: the trainer's split).
def prepare_model_dir(path: str, config, vocab_proto: bytes,
                      target_vocab_proto: bytes | None = None) -> None:
    """ModelDir(path).prepare(...)."""
    ModelDir(path).prepare(config, vocab_proto, target_vocab_proto)


def best_summary(path: str) -> str:
    """ModelDir(path).best_summary()."""
    return ModelDir(path).best_summary()
