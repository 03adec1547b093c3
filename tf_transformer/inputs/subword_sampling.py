"""BPE-dropout of the shared SentencePiece BPE vocabulary, in the graph, seeded.

Subword regularisation for training (Provilkov et al. 2020, "BPE-Dropout"):
each time BPE would merge two adjacent symbols, the merge is skipped with
probability `alpha`, so one sentence gets a different segmentation in each
pass over the data. This is SentencePiece's own BPE sampling (its
`bpe_model.cc`: candidates popped best score first, leftmost on a tie, a
skipped candidate dropped until a merge beside it makes a new pair), redone in
TensorFlow ops because neither library takes a seed per sentence:
tensorflow-text's op draws from an unseeded generator, and the `sentencepiece`
package's seed is one process-wide setting that parallel tf.data threads would
race on. Here every draw is a counter-based hash (SplitMix64's finaliser,
Steele et al. 2014) of (seed, pass, line, side, draw), so a `--deterministic`
run repeats and a restored input position goes on with the very draws an
uninterrupted run makes. (`stateless_uniform` takes one key per call: a call
per line cost more than the merges; `RandomIndexShuffle`, which takes a key per
row, barely mixes a 2^62 domain.)

The sampler starts from the deterministic ids (SentencePiece's normalisation
and byte fallback already applied), takes their characters apart again, and
merges within each word (a word starts at "▁": no BPE piece has "▁" inside, so
merges never cross words). Symbols are ids; a merge (left, right) -> piece is
a sorted table of left * vocab_size + right keys, the piece's score its rank.
Byte pieces, <unk> and user-defined pieces stay whole, as in SentencePiece.
With alpha = 0 the result is SentencePiece's encoding, id for id.

`repeat_counting_passes` numbers the passes of a repeated dataset, the "epoch"
the draws are keyed by; the pipeline applies both (pipeline.token_pairs).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# Merge loops by word length: a loop costs words x width x steps, so one long
# word (a path, a URL) would otherwise widen every word's loop.
WORD_WIDTHS = (8, 16, 32)
# Draws per character a word may need: each step merges (at most chars - 1 times)
# or drops a candidate pair (at most chars - 1 initial pairs + 2 per merge), so
# draw DRAWS_PER_CHAR * (the word's first character in its line) + step is the word's own.
DRAWS_PER_CHAR = 4
NO_SYMBOL = -1
GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment: an odd 2^64 / golden ratio


def mix64(z: tf.Tensor) -> tf.Tensor:
    """SplitMix64's finaliser, a bijection of uint64 whose outputs pass BigCrush."""
    for shift_by, multiplier in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(shift_by, tf.uint64)))
        z = z * tf.constant(multiplier, tf.uint64)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(31, tf.uint64)))


def fold_in(key: tf.Tensor, value: tf.Tensor) -> tf.Tensor:
    """A new uint64 key from `key` and an integer `value` (shapes broadcast)."""
    value = tf.cast(tf.cast(value, tf.int64), tf.uint64)
    return mix64(key + (value + 1) * tf.constant(GOLDEN, tf.uint64))


def uniform(key: tf.Tensor, counter: tf.Tensor) -> tf.Tensor:
    """float64 in [0, 1): draw number `counter` of `key` (shapes broadcast)."""
    bits = tf.bitwise.right_shift(fold_in(key, counter), tf.constant(11, tf.uint64))
    return tf.cast(bits, tf.float64) * 2.0 ** -53


class BpeMerges:
    """A SentencePiece BPE model as id tables (numpy).

    Attributes:
      vocab_size: V.
      symbol_values, symbol_splits: each piece's initial symbols (its characters'
        ids for a normal piece, itself for any other), ragged [V, (chars)].
      merge_keys: int64 [M] sorted, left * V + right for every split of a normal
        piece into two pieces; merged: int32 [M], the piece they make.
      scores: float32 [V], the pieces' scores (higher merges first).
      space_id: the id of "▁", where words start.
    """

    def __init__(self, model_proto: bytes):
        from sentencepiece import sentencepiece_model_pb2 as spm_pb2

        proto = spm_pb2.ModelProto.FromString(model_proto)
        piece_type = spm_pb2.ModelProto.SentencePiece
        if proto.trainer_spec.model_type != spm_pb2.TrainerSpec.BPE:
            raise ValueError("subword sampling needs a BPE SentencePiece model")
        if any(p.type == piece_type.UNUSED for p in proto.pieces):
            raise ValueError("subword sampling does not support UNUSED pieces")
        self.vocab_size = len(proto.pieces)
        ids = {p.piece: i for i, p in enumerate(proto.pieces)
               if p.type in (piece_type.NORMAL, piece_type.USER_DEFINED)}
        normal = [(i, p.piece) for i, p in enumerate(proto.pieces) if p.type == piece_type.NORMAL]
        if any("▁" in piece[1:] for _, piece in normal):
            raise ValueError("subword sampling needs pieces with '▁' only in front "
                             "(split_by_whitespace)")
        symbols = [[i] for i in range(self.vocab_size)]
        keys, merged = [], []
        for i, piece in normal:
            if len(piece) < 2:
                continue
            symbols[i] = [ids[char] for char in piece]  # BPE keeps every character a piece
            for cut in range(1, len(piece)):
                left, right = ids.get(piece[:cut]), ids.get(piece[cut:])
                if left is not None and right is not None:
                    keys.append(left * self.vocab_size + right)
                    merged.append(i)
        order = np.argsort(keys)
        self.merge_keys = np.asarray(keys, np.int64)[order]
        self.merged = np.asarray(merged, np.int32)[order]
        self.symbol_values = np.concatenate(symbols).astype(np.int32)
        self.symbol_splits = np.cumsum([0] + [len(s) for s in symbols]).astype(np.int64)
        self.scores = np.array([p.score for p in proto.pieces], np.float32)
        self.space_id = ids["▁"]


class SubwordSampler:
    """Samples BPE-dropout segmentations of deterministic SentencePiece ids.

    Args:
      model_proto: the serialized SentencePiece BPE model the ids come from.
      alpha: probability of skipping each merge, in [0, 1).
      seed: the run's seed; the draws are a function of (seed, epoch, line, side).
    """

    def __init__(self, model_proto: bytes, alpha: float, seed: int):
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        self.alpha, self.seed = float(alpha), int(seed)
        merges = BpeMerges(model_proto)
        self.vocab_size, self.space_id = merges.vocab_size, merges.space_id
        self._symbols = tf.RaggedTensor.from_row_splits(
            tf.constant(merges.symbol_values), tf.constant(merges.symbol_splits))
        self._merge_keys = tf.constant(merges.merge_keys)
        self._merged = tf.constant(merges.merged)
        self._scores = tf.constant(merges.scores)

    def sample(self, ids: tf.RaggedTensor, lines: tf.Tensor, epoch: tf.Tensor,
               sides: tf.Tensor | int) -> tf.RaggedTensor:
        """One sampled segmentation per line.

        Args:
          ids: int32 ragged [N, (tokens)], SentencePiece's deterministic ids.
          lines: int64 [N], each line's number in the corpus.
          epoch: int64 [N] (or a scalar), the pass over the data.
          sides: [N] (or a scalar), 0 for a source line, 1 for a target: the two
            sides of a pair draw apart.
        Returns:
          int32 ragged [N, (sampled tokens)], detokenizing to the same text.
        """
        chars = self._symbols.with_row_splits_dtype(ids.row_splits.dtype)
        chars = tf.gather(chars, ids).merge_dims(1, 2)  # [N, (chars)]
        values, line = chars.flat_values, chars.value_rowids()
        position = tf.range(tf.size(values, out_type=tf.int64))
        in_line = position - tf.gather(chars.row_starts(), line)
        word_starts = tf.where((values == self.space_id) | (in_line == 0))[:, 0]  # [W]
        words = tf.RaggedTensor.from_row_starts(values, word_starts, validate=False)
        line_of_word = tf.gather(line, word_starts)
        key = fold_in(fold_in(fold_in(mix64(tf.constant(self.seed, tf.uint64)), epoch),
                              lines), sides)  # [N] or a scalar: broadcast to the lines
        keys = tf.gather(tf.broadcast_to(key, tf.shape(lines)), line_of_word)
        first_draws = DRAWS_PER_CHAR * tf.gather(in_line, word_starts)
        merged = self._merge_words(words, keys, first_draws)
        by_line = tf.RaggedTensor.from_value_rowids(merged, line_of_word, nrows=chars.nrows(),
                                                    validate=False)
        return by_line.merge_dims(1, 2).with_row_splits_dtype(ids.row_splits.dtype)

    def _merge_words(self, words: tf.RaggedTensor, keys: tf.Tensor,
                     first_draws: tf.Tensor) -> tf.RaggedTensor:
        """Each word's merges, by groups of word length: [W, (chars)] -> [W, (pieces)].

        `keys` uint64 [W] and `first_draws` int64 [W]: word w's step t merges
        unless uniform(keys[w], first_draws[w] + t) < alpha."""
        lengths = words.row_lengths()
        bounds = (0,) + WORD_WIDTHS
        parts, rows = [], []
        for low, high in zip(bounds, bounds[1:] + (None,)):
            in_group = lengths > low if high is None else (lengths > low) & (lengths <= high)
            index = tf.where(in_group)[:, 0]
            group = tf.gather(words, index).to_tensor(NO_SYMBOL)
            symbols = self._merge_dense(group, tf.gather(keys, index),
                                        tf.gather(first_draws, index))
            parts.append(tf.RaggedTensor.from_tensor(
                symbols, lengths=tf.reduce_sum(tf.cast(symbols != NO_SYMBOL, tf.int64), 1)))
            rows.append(index)
        order = tf.argsort(tf.concat(rows, 0))  # back to the words' order
        return tf.gather(tf.concat(parts, 0), order)

    def _lookup(self, left: tf.Tensor, right: tf.Tensor) -> tf.Tensor:
        """The piece `left` + `right` makes, or NO_SYMBOL: int32, left's shape."""
        keys = tf.cast(left, tf.int64) * self.vocab_size + tf.cast(right, tf.int64)
        flat = tf.reshape(keys, [-1])
        position = tf.searchsorted(self._merge_keys, flat)
        position = tf.minimum(position, tf.size(self._merge_keys) - 1)
        found = (tf.gather(self._merge_keys, position) == flat) & (
            tf.reshape((left >= 0) & (right >= 0), [-1]))
        merged = tf.where(found, tf.gather(self._merged, position), NO_SYMBOL)
        return tf.reshape(merged, tf.shape(left))

    def _merge_dense(self, symbols: tf.Tensor, keys: tf.Tensor,
                     first_draws: tf.Tensor) -> tf.Tensor:
        """BPE with dropout on words padded with NO_SYMBOL: [w, c] -> [w, c + 1], the
        pieces first in each row. One candidate per word per step: the best-scored
        pair not dropped (leftmost on a tie), merged unless its draw is < alpha."""
        pad = tf.fill([tf.shape(symbols)[0], 1], NO_SYMBOL)
        symbols = tf.concat([symbols, pad], 1)  # never 0 wide: argmax needs a column
        columns = tf.range(tf.shape(symbols)[1])[None, :]
        # A dropped candidate becomes NO_SYMBOL until a merge beside it makes a new pair.
        pairs = self._lookup(symbols, tf.concat([symbols[:, 1:], pad], 1))  # [w, c + 1]
        minus_inf = tf.constant(-np.inf, tf.float32)

        def step(symbols, pairs, rows, keys, draws, merged):
            scores = tf.where(pairs >= 0, tf.gather(self._scores, tf.maximum(pairs, 0)), minus_inf)
            best = tf.argmax(scores, axis=1, output_type=tf.int32)[:, None]  # first of the best
            active = tf.reduce_max(scores, axis=1) > minus_inf
            # A word without candidates is done: out of the loop, which goes on with the rest.
            done = tf.where(~active)
            merged = tf.tensor_scatter_nd_update(merged, tf.gather(rows, done),
                                                 tf.gather_nd(symbols, done))
            symbols, pairs, best, rows, keys, draws = (tf.boolean_mask(x, active) for x in (
                symbols, pairs, best, rows, keys, draws))
            merge = uniform(keys, draws)[:, None] >= self.alpha
            at_best = columns == best
            piece = tf.gather(pairs, best, batch_dims=1)
            pairs = tf.where(at_best & ~merge, NO_SYMBOL, pairs)
            # A merge at j: the piece at j, the columns after it move one left.
            source = tf.where(merge & (columns > best), columns + 1, columns)
            symbols = tf.where(merge & at_best, piece, shift(symbols, source, NO_SYMBOL))
            pairs = shift(pairs, source, NO_SYMBOL)
            # The pairs either side of the new piece are new candidates.
            edge = tf.fill([tf.shape(symbols)[0], 1], NO_SYMBOL)
            around = tf.gather(tf.concat([edge, symbols, edge], 1), best + [[0, 1, 2]],
                               batch_dims=1)
            fresh = self._lookup(around[:, :2], around[:, 1:])  # [a, 2]: (j - 1, j), (j, j + 1)
            pairs = tf.where(merge & (columns == best - 1), fresh[:, :1], pairs)
            pairs = tf.where(merge & at_best, fresh[:, 1:], pairs)
            return symbols, pairs, rows, keys, draws + 1, merged

        rows = tf.range(tf.shape(symbols, out_type=tf.int64)[0])
        state = (symbols, pairs, rows, keys, first_draws, symbols)
        invariants = (tf.TensorShape([None, None]),
                      tf.TensorShape([None, None]), tf.TensorShape([None]),
                      tf.TensorShape([None]), tf.TensorShape([None]), symbols.shape)
        loop = tf.while_loop(lambda symbols, *_: tf.shape(symbols)[0] > 0, step, state,
                             shape_invariants=invariants)
        return loop[-1]


class PairSampler:
    """BPE-dropout of both sides of a pair, each with its side's vocabulary.

    Args:
      source_model, target_model: the sides' serialized SentencePiece models (one
        shared vocabulary: the same bytes).
      alpha, seed: as SubwordSampler's.
    """

    def __init__(self, source_model: bytes, target_model: bytes, alpha: float, seed: int):
        self.source = SubwordSampler(source_model, alpha, seed)
        self.target = (self.source if target_model == source_model
                       else SubwordSampler(target_model, alpha, seed))

    def __call__(self, sources: tf.RaggedTensor, targets: tf.RaggedTensor, lines: tf.Tensor,
                 epoch: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
        """Sampled (sources, targets), each int32 ragged [N, (tokens)], from the
        deterministic ids; `lines` and `epoch` int64 [N]."""
        if self.target is not self.source:
            return (self.source.sample(sources, lines, epoch, 0),
                    self.target.sample(targets, lines, epoch, 1))
        # One vocabulary: both sides in one call, so the merge loops run once.
        rows = sources.nrows()
        both = self.source.sample(
            tf.concat([sources, targets], 0), tf.concat([lines, lines], 0),
            tf.concat([epoch, epoch], 0),
            tf.concat([tf.zeros([rows], tf.int64), tf.ones([rows], tf.int64)], 0))
        return both[:rows], both[rows:]


def shift(values: tf.Tensor, source: tf.Tensor, fill) -> tf.Tensor:
    """values[i, source[i, j]], `fill` past the row's end: [w, c] -> [w, c]."""
    padded = tf.concat([values, tf.fill([tf.shape(values)[0], 1], fill)], 1)
    return tf.gather(padded, source, batch_dims=1)


def repeat_counting_passes(dataset: tf.data.Dataset, repeat: bool) -> tf.data.Dataset:
    """The dataset's elements (dicts), repeated if `repeat`, each with "epoch":
    int64, the number of the pass it comes from (0 first).

    A pass restarts `enumerate`'s count, so a position of 0 opens the next pass;
    the scan's state is part of an iterator checkpoint.
    """
    dataset = dataset.enumerate()
    if repeat:
        dataset = dataset.repeat()

    def count(epoch, element):
        position, pair = element
        epoch = epoch + tf.cast(position == 0, tf.int64)
        return epoch, {**pair, "epoch": epoch}

    return dataset.scan(tf.constant(-1, tf.int64), count)
