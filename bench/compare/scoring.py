"""The one score every system gets in the protocol: sacreBLEU of detokenized text against
the raw references, of each system's own decoder (test BLEU and the dev curves); the
SentencePiece pieces files the peers translate."""

import sys


def bleu(hypotheses, references) -> float:
    """Corpus sacreBLEU (its default 13a tokenization) of `hypotheses` against one
    reference each."""
    import sacrebleu
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def ours_bleu(run, model_dir, data, flags, hypotheses, references) -> float:
    """BLEU of `python -m tf_transformer.evaluate` on the TSV `data` (beam 4, alpha 0.6,
    batch 32; `flags` after --data), its translations in `hypotheses`; `run(command)`."""
    run([sys.executable, "-m", "tf_transformer.evaluate", f"--model_dir={model_dir}",
         f"--data={data}", *flags, "--batch_size=32", "--beam_size=4", "--alpha=0.6",
         f"--hypotheses={hypotheses}"])
    with open(hypotheses, encoding="utf-8") as f:
        return bleu([line.rstrip("\n") for line in f], references)


def opennmt_bleu(run, flags, features, predictions, sp, references) -> float:
    """BLEU of `onmt-main FLAGS infer` (the OpenNMT-tf venv's) on the pieces file `features`,
    its pieces in `predictions`, detokenized by the SentencePiece processor `sp`; `run(command)`."""
    from bench.compare.trainings import ONMT_MAIN

    run([ONMT_MAIN, *flags, "infer", "--features_file", features, "--predictions_file", predictions])
    with open(predictions, encoding="utf-8") as f:
        return bleu([sp.decode(line.split()) for line in f], references)


def write_pieces(path, sp, texts) -> str:
    """`texts` as the SentencePiece processor `sp`'s pieces, one line each, into `path`."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(" ".join(sp.encode(t, out_type=str)) + "\n" for t in texts)
    return path
