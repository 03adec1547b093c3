"""Translates stdin with an exported SavedModel, using only TensorFlow (no project code).

  python -I export/serving/translate_saved_model.py --saved_model=EXPORT_DIR/1 < in.txt > out.txt

A client example and the clean-process check of tests/exporters/test_export_processes.py.
It imports nothing of this repository, keras, keras_hub or keras_nlp; with
--refuse=all an import hook makes any attempt to import them fail, and records it.

The tensorflow-text ops are registered in one of two ways:
  --ops=tensorflow_text  `import tensorflow_text` (the usual way). Note that
      tensorflow_text's own __init__ imports Keras (its keras layers subclass
      tf.keras.layers.Layer), so this mode cannot be combined with refusing keras.
  --ops=libraries  tf.load_op_library on tensorflow_text's compiled op
      libraries (_sentencepiece_tokenizer.so: SentencepieceOp, SentencepieceTokenizeOp,
      SentencepieceDetokenizeOp, ...), found without importing the package. This is
      what a C++ server that links the ops does, and it runs with --refuse=all.

Output: one translation per input line (newlines in a translation become
spaces, as in the translate binary); stderr ends with one JSON status line.
Lines are split on "\\n" only, a trailing "\\r" dropped, invalid UTF-8 passed
to the model as bytes.
"""

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys

REFUSED = ("keras", "keras_hub", "keras_nlp", "tf_keras", "tf_transformer")  # --refuse=all
refused_names: set = set()
looked_up: list = []
refused: list = []


class _RefusingLoader(importlib.abc.Loader):
    def create_module(self, spec):
        refused.append({"module": spec.name, "importer": _importer()})
        raise ImportError(f"{spec.name} is refused in this process")

    def exec_module(self, module):
        raise ImportError("refused")


def _importer() -> str:
    """file:line of the innermost frame outside importlib and this hook."""
    frame = sys._getframe(2)
    while frame and (frame.f_code.co_filename.startswith("<frozen")
                     or frame.f_code.co_filename.endswith(("importlib/__init__.py", __file__))):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "?"


class _Refuse(importlib.abc.MetaPathFinder):
    """Answers lookups of the refused packages with a spec whose loading fails.

    `import tensorflow` looks up keras (importlib.util.find_spec, to point the
    lazy `tf.keras` at it: a spec without an origin tells it none is there) and
    tries `import keras.src.optimizers` (tensorflow/__init__.py, "eager load
    for Keras' code ... registration of optimizers in the SavedModel registry"),
    ignoring the ImportError; both are recorded, neither is needed.
    """

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in refused_names:
            looked_up.append(name)
            return importlib.machinery.ModuleSpec(name, _RefusingLoader())
        return None


def register_text_ops(mode: str) -> None:
    import tensorflow as tf

    if mode == "tensorflow_text":
        import tensorflow_text  # noqa: F401  (registers the ops)
        return
    spec = importlib.util.find_spec("tensorflow_text")  # locates; does not import
    ops_dir = os.path.join(list(spec.submodule_search_locations)[0], "python", "ops")
    tf.load_op_library(os.path.join(ops_dir, "_sentencepiece_tokenizer.so"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--saved_model", required=True, help="A version directory.")
    parser.add_argument("--signature", default="serving_default")
    parser.add_argument("--ops", choices=("tensorflow_text", "libraries"),
                        default="tensorflow_text")
    parser.add_argument("--refuse", default="",
                        help="Comma-separated top-level packages whose import fails; 'all': "
                             + ",".join(REFUSED))
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()
    refused_names.update(REFUSED if args.refuse == "all" else filter(None, args.refuse.split(",")))
    if refused_names:
        sys.meta_path.insert(0, _Refuse())
    import tensorflow as tf

    register_text_ops(args.ops)
    serve = tf.saved_model.load(args.saved_model).signatures[args.signature]
    raw = sys.stdin.buffer.read().split(b"\n")
    if raw[-1] == b"":
        raw.pop()
    lines = [line[:-1] if line.endswith(b"\r") else line for line in raw]
    out = sys.stdout.buffer
    for start in range(0, len(lines), args.batch_size):
        result = serve(text=tf.constant(lines[start:start + args.batch_size], tf.string))
        for text in result["translation"].numpy():
            text = text.decode("utf-8", errors="replace").replace("\n", " ").replace("\r", " ")
            out.write(text.encode("utf-8") + b"\n")
    out.flush()
    status = {
        "lines": len(lines),
        "refused_imports": refused,
        "looked_up": sorted(set(looked_up)),
        "loaded_modules": sorted(m for m in sys.modules if m.split(".")[0] in REFUSED),
        "sys_path": sys.path,
    }
    print(json.dumps(status), file=sys.stderr)


if __name__ == "__main__":
    main()
