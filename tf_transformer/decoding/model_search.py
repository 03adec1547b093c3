"""The beam search over a Transformer's incremental decoder: what every search of
one Translator shares.

`ModelSearch` turns a batch of source ids into a `BeamSearch` (search/) over
`decode_step`: the beam, each sentence's length limit (its source tokens, EOS
included, + extra_length, capped at the model's max_positions), and the kernel
policies of encoding and of a step (model/kernels.py: `for_inference` of the
model's compute dtype). The Translator runs it in
graph mode (`run`, with or without alignments); compiled_search.py runs it under
XLA with static shapes. `sample` runs search/sampling.py's loop on the same step
and cache.
"""

from __future__ import annotations

import dataclasses
import functools

import tensorflow as tf

from tf_transformer.config import PAD_ID
from tf_transformer.model import kernels
from tf_transformer.model.transformer import Transformer
from tf_transformer.search import prefix as prefix_lib
from tf_transformer.search import sampling, shape_buckets
from tf_transformer.search.beam_search import AlignedSearchResult, BeamSearch, BeamSearchResult
from tf_transformer.search.state import SymbolsToLogitsFn


@dataclasses.dataclass(frozen=True)
class ModelSearch:
    """Args:
      model: a built Transformer.
      beam_size: k (1: greedy decoding on the same path).
      max_source_length: source tokens accepted, EOS included.
      max_target_length: output tokens at most, EOS included (max_positions).
      decode_step: the search's symbols_to_logits_fn; default the model's
        decode_step on its step kernels (tools wrap it to count steps).
      never_ids: token ids the search never generates besides PAD and BOS
        (<unk> for a target vocabulary with byte fallback).
      bounded_shapes: `run` and `sample` pad the batch and the source width to
        search/shape_buckets.py's buckets and shrink the working rows by buckets,
        so a server meets a fixed set of shapes (not with alignments, whose
        output spans the source's own width); the outputs are the same.
    """

    model: Transformer
    beam_size: int
    max_source_length: int
    max_target_length: int
    decode_step: SymbolsToLogitsFn | None = None
    never_ids: tuple[int, ...] = ()
    bounded_shapes: bool = False

    @property
    def kernels(self) -> kernels.InferenceKernels:
        return kernels.for_inference(self.model.compute_dtype)

    def step_fn(self, with_attention: bool = False) -> SymbolsToLogitsFn:
        """The search's step; `with_attention`: it also returns the step's alignment row
        (decode_step's with_attention, a given decode_step's too)."""
        if self.decode_step is not None:
            if with_attention:
                return functools.partial(self.decode_step, with_attention=True)
            return self.decode_step
        if with_attention:
            return functools.partial(self.model.decode_step, kernels=self.kernels.step,
                                     with_attention=True)
        return functools.partial(self.model.decode_step, kernels=self.kernels.step)

    def max_lengths(self, source_ids, extra_length, sentences=None) -> tf.Tensor:
        """int32 [batch]: each source's token count + extra_length, capped (module
        docstring); rows from `sentences` on are padding (shape_buckets): 1, EOS alone."""
        source_lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)
        max_lengths = tf.minimum(source_lengths + extra_length, self.max_target_length)
        if sentences is None:
            return max_lengths
        return tf.where(tf.range(tf.shape(source_ids)[0]) < sentences, max_lengths, 1)

    def beam_search(self, source_ids, alpha, extra_length, nbest: int,
                    max_decode_length=None, alignments: bool = False,
                    prefix: prefix_lib.TargetPrefix | None = None,
                    sentences=None) -> BeamSearch:
        """The settings of one search over `source_ids` (BeamSearch's arguments);
        `alignments`: over the source's width; `prefix`: the outputs start with it;
        `sentences`: the real rows of a batch padded to bounded shapes."""
        width = tf.shape(source_ids)[1] if alignments else None
        return BeamSearch(self.step_fn(alignments), vocab_size=self.model.vocab_size,
                          beam_size=self.beam_size, alpha=alpha, nbest=nbest,
                          max_lengths=self.max_lengths(source_ids, extra_length, sentences),
                          max_decode_length=max_decode_length, never_ids=self.never_ids,
                          alignment_width=width, prefix=prefix,
                          row_buckets=sentences is not None)

    def run(self, source_ids, alpha, extra_length, nbest: int, alignments: bool = False,
            prefix: prefix_lib.TargetPrefix | None = None
            ) -> BeamSearchResult | AlignedSearchResult:
        """One graph-mode search over the whole batch: the cache grows by chunks,
        finished sentences leave the working rows. The encoder and the memory's
        projections run on the encoding kernels (float32: Eigen's, for a new
        source width each batch). `alignments`: an AlignedSearchResult, over the
        source's S positions. `prefix`: each output starts with its prefix
        (search/prefix.py; at most max_target_length - 1 tokens)."""
        sentences = None
        if self.bounded_shapes and not alignments:
            sentences = tf.shape(source_ids)[0]
            source_ids, prefix = _padded(source_ids, prefix, self.max_source_length)
        search = self.beam_search(source_ids, alpha, extra_length, nbest,
                                  alignments=alignments, prefix=prefix, sentences=sentences)
        cache = self.initial_cache(source_ids, search.max_decode_length, aligned=alignments)
        return _first_rows(search.finish(search.advance(search.start(cache))), sentences)

    def sample(self, source_ids, alpha, extra_length, topk, topp, temperature,
               seed, prefix: prefix_lib.TargetPrefix | None = None) -> BeamSearchResult:
        """One output per source drawn by search/sampling.py (graph mode), nbest 1;
        `prefix` as run's; bounded shapes as run's (a sentence's draws do not depend on
        the rows after it: search/sampling.py's `draw`)."""
        sentences = None
        if self.bounded_shapes:
            sentences = tf.shape(source_ids)[0]
            source_ids, prefix = _padded(source_ids, prefix, self.max_source_length)
        max_lengths = prefix_lib.raise_max_lengths(
            prefix, self.max_lengths(source_ids, extra_length, sentences))
        cache = self.initial_cache(source_ids, tf.maximum(tf.reduce_max(max_lengths), 1))
        return _first_rows(sampling.sample(
            self.step_fn(), cache, vocab_size=self.model.vocab_size, max_lengths=max_lengths,
            seed=seed, topk=topk, topp=topp, temperature=temperature, alpha=alpha,
            never_ids=self.never_ids, prefix=prefix, row_buckets=self.bounded_shapes), sentences)

    def initial_cache(self, source_ids, positions, aligned: bool = False):
        """The batch's decoding cache for `positions` steps: encoded and projected on
        the encoding kernels, the memory padded to the step's memory_multiple
        positions (not when `aligned`: alignments span the source's own positions)."""
        encoding = self.kernels.encoding
        memory = self.model.encode(source_ids, training=False, kernels=encoding)
        return self.model.initial_cache(
            memory, source_ids, positions=positions, kernels=encoding,
            memory_multiple=1 if aligned else self.kernels.step.memory_multiple)


def _padded(source_ids, prefix: prefix_lib.TargetPrefix | None, max_width: int):
    """The sources (and prefixes) padded to shape_buckets' rows and width."""
    source_ids = shape_buckets.pad_sources(source_ids, max_width)
    if prefix is not None:
        rows = tf.shape(source_ids)[0]
        prefix = prefix_lib.TargetPrefix(shape_buckets.pad_rows(prefix.ids, rows),
                                         shape_buckets.pad_rows(prefix.lengths, rows))
    return source_ids, prefix


def _first_rows(result, sentences):
    """The result of the first `sentences` rows (all with None)."""
    if sentences is None:
        return result
    return tf.nest.map_structure(lambda t: t[:sentences], result)
