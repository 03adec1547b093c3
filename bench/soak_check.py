"""The soak's translations against the Translator's, request by request.

  python -m bench.soak_check --record=SOAK.jsonl

Reads a record of `python -m bench.serving_soak --record` (the export's path, then each
request's lines and the export's translations), builds the Translator the export was
made from (its metadata: model directory, checkpoints, search settings, bounded shapes;
`--unpadded`: the unpadded search) and translates every request again as one batch.
Prints `soak_check requests=N sentences=S differ=D` and the first differing lines.
"""

from __future__ import annotations

import argparse
import json
import os


def translator_of(export: str, unpadded: bool = False):
    """The Translator of an export's metadata, its weights checked against the export's."""
    from tf_transformer.decoding.translator import Translator
    from tf_transformer.exporters import saved_model
    from tf_transformer.model_dir import ModelDir
    with open(os.path.join(export, "assets", saved_model.METADATA_FILE), encoding="utf-8") as f:
        metadata = json.load(f)
    model_dir = ModelDir(metadata["model_dir"])
    config = model_dir.read_config()
    settings = ("beam_size", "nbest", "alpha", "extra_length", "jit_compile", "dtype", "bounded_shapes")
    decode = config.decode.with_overrides({**{k: metadata["decode"][k] for k in settings},
                                           **({"bounded_shapes": False} if unpadded else {})})
    averaged, checkpoints = metadata["averaged"], metadata["checkpoints"]
    translator = Translator.from_model_dir(model_dir, None if averaged else checkpoints[0], decode,
                                           averaged, config=config)
    if [os.path.abspath(p) for p in translator.checkpoint_paths] != checkpoints:
        raise SystemExit(f"checkpoints changed since the export: {translator.checkpoint_paths}")
    return translator


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", required=True, help="bench.serving_soak's --record file.")
    parser.add_argument("--unpadded", action="store_true", help="Against the unpadded search.")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    with open(args.record, encoding="utf-8") as f:
        export, requests = json.loads(f.readline())["export"], [json.loads(line) for line in f]
    translator = translator_of(export, args.unpadded)
    differ = sentences = 0
    for request in requests:
        text = tf.constant([line.encode("utf-8", "surrogateescape") for line in request["text"]])
        ours = [t.decode("utf-8", "surrogateescape") for t in translator.translate(text)["translation"].numpy()]
        for line, served, expected in zip(request["text"], request["translation"], ours):
            if served != expected and differ < 5:
                print(f"differ: {line[:80]!r} export={served[:80]!r} translator={expected[:80]!r}")
            differ += served != expected
        sentences += len(ours)
    print(f"soak_check requests={len(requests)} sentences={sentences} differ={differ}")


if __name__ == "__main__":
    main()
