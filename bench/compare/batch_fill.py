"""Real tokens per training step of each system's batching, computed from the corpus.

  python bench/compare/batch_fill.py [--corpus_dir=...] [--vocab=WORK_DIR/data/vocab.model]

Why two systems with the same 4096-position budget put different work in a step:
ours repeats the shuffled pairs *before* bucketing, so every batch is full;
OpenNMT-tf 2.32 (`training_pipeline`) buckets *then* repeats, so at every epoch
end each open length window is emitted as a partial batch. With its window
per exact length (`length_bucket_width: 1`) a small corpus ends each epoch with
one partial batch per distinct length. This script replays both rules on the
corpus's lengths (no TensorFlow in the loop) and prints, for ours and for
OpenNMT-tf at several bucket widths, the mean real tokens per step (each
system's own count) and the batches per epoch.
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)


def ours(sources, targets, budget, max_length=256):
    """Mean real tokens (pieces + EOS each side) per batch, and batches per epoch."""
    from tf_transformer.inputs.pipeline import bucket_boundaries

    bounds = np.array(bucket_boundaries(max_length))
    length = np.maximum(sources + 1, targets + 1)  # EOS on the source; BOS/EOS on the target
    keep = length <= max_length
    key = np.searchsorted(bounds, length[keep])  # the first boundary >= length
    rows = budget // bounds[key]
    batches = np.sum([np.sum(key == k) / rows[key == k][0] for k in np.unique(key)])
    return (sources[keep] + targets[keep] + 2).sum() / batches, batches


def opennmt(sources, targets, budget, width, epochs=6, seed=0, max_length=256):
    """OpenNMT-tf's group_by_window per ceil(length / width) - 1, then repeat."""
    rng = np.random.default_rng(seed)
    length = np.maximum(sources, targets + 1)  # its source has no EOS; labels carry one
    index = np.nonzero((sources <= max_length) & (targets + 1 <= max_length))[0]
    key = np.maximum(np.ceil(length / width).astype(int) - 1, 0)
    size = np.maximum(budget // ((key + 1) * width), 1)
    batches = []
    for _ in range(epochs):
        windows = {}
        for i in rng.permutation(index):
            window = windows.setdefault(key[i], [])
            window.append(i)
            if len(window) == size[i]:
                batches.append(window)
                windows[key[i]] = []
        batches += [w for w in windows.values() if w]  # the epoch-end flush
    real = [sources[b].sum() + targets[b].sum() + len(b) for b in batches]
    return float(np.mean(real)), len(batches) / epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus_dir",
                        default=os.path.join(REPO, "..", "shared", "corpora", "libreoffice-help.en-de"))
    parser.add_argument("--vocab", default=os.path.join(REPO, "bench", "out", "compare", "data",
                                                        "vocab.model"))
    parser.add_argument("--budget", type=int, default=4096)
    args = parser.parse_args()
    import sentencepiece as spm

    from tf_transformer.inputs import corpus, tokenizer

    pairs = corpus.read_tsv(os.path.join(args.corpus_dir, "train.tsv"))
    if not os.path.exists(args.vocab):
        os.makedirs(os.path.dirname(args.vocab), exist_ok=True)
        tokenizer.train_sentencepiece(pairs, 8000, args.vocab)
    sp = spm.SentencePieceProcessor(model_file=args.vocab)
    sources = np.array([len(x) for x in sp.encode(list(pairs.sources))])
    targets = np.array([len(x) for x in sp.encode(list(pairs.targets))])
    real, batches = ours(sources, targets, args.budget)
    print(f"ours real_tokens_per_step={real:.0f} batches_per_epoch={batches:.0f}")
    for width in (1, 2, 4, 8):
        real_o, batches_o = opennmt(sources, targets, args.budget, width)
        print(f"opennmt length_bucket_width={width} real_tokens_per_step={real_o:.0f} "
              f"batches_per_epoch={batches_o:.0f} ratio_to_ours={real_o / real:.2f}")


if __name__ == "__main__":
    main()
