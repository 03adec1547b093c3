"""The one strings-to-strings translation path (section 6.1 decoding).

`Translator` is a `tf.Module` holding the Keras model, the `Tokenizer` (or a
`TokenizerPair`: the source side's tokenizes, the target side's detokenizes) and the
decoding settings. Its `tf.function` methods, each with an input signature,
tokenize, beam-search and detokenize inside the graph, so evaluation, the
translate binary and the exported SavedModel run the same graph (the export
saves this module; loading it needs only tensorflow and tensorflow_text).

Source side: the tokenized text is cut to `max_source_length - 1` tokens and
EOS is appended, as in training (`inputs/pipeline.py`: source = x + [EOS]), so a
source never exceeds `config.data.max_length`, the longest source the model
was trained on. Invalid UTF-8 needs no sanitising: the SentencePiece op maps
each invalid byte run to <unk> (see tokenizer.py). An input with no tokens
(empty or whitespace only) translates to "" with score 0.

Target side: at most `source_length + extra_length` tokens, EOS included (source
tokens with EOS), capped at the model's `max_positions` (a learned position table).
With a target vocabulary with byte fallback, the search never generates <unk>
(as it never generates PAD or BOS): every character has pieces, so <unk> is
never a correct output, and it would detokenize to " ⁇ ".

`beam_size` (shapes depend on it) and `nbest` are fixed at construction; `alpha`
and `extra_length` may be overridden per call: a negative value, the default,
means the configured one. A beam of 1 is greedy decoding on the same path.

`decode_config.dtype`: bfloat16, the model's weights and products (on oneDNN: model/kernels.py),
or int8, a bfloat16 model whose step projects in int8 (model/quantized.py); from_model_dir
builds the model so. Scores, softmax statistics and the search stay float32.

In graph mode the decoding cache grows by chunks of positions, and on a CPU
a large batch is searched as `parallel_searches` sub-batches side by side (on
a GPU as one: `searches_per_batch`). With
`decode_config.jit_compile` the search runs as one XLA computation on padded,
fixed shapes (compiled_search.py; the tokenizer ops stay outside it). Outputs are
the same either way.

Beside the beam search: `score` (log P(y | x) of given pairs, teacher-forced:
scoring.py), `sample` (one output drawn per input: search/sampling.py) and
`translate_with_alignments` (the search with its alignments, <unk> replaced by
aligned source text: alignments.py), `translate_with_prefix` and `sample_with_prefix`
(outputs that continue given target prefixes: search/prefix.py). These run one
graph-mode search whatever `jit_compile` and `parallel_searches` say.
"""

from __future__ import annotations

import functools

import tensorflow as tf
from absl import logging

from tf_transformer.config import EOS_ID, PAD_ID, UNK_ID, Config, DecodeConfig
from tf_transformer.decoding import alignments, scoring, signatures
from tf_transformer.decoding.compiled_search import CompiledSearch
from tf_transformer.decoding.model_search import ModelSearch
from tf_transformer.inputs import tokenizer as tokenizer_lib
from tf_transformer.inputs.tokenizer import Tokenizer, TokenizerPair
from tf_transformer.model import kernels, quantized
from tf_transformer.model.transformer import Transformer
from tf_transformer.model_dir import ModelDir, load_model
from tf_transformer.search import prefix as prefix_lib
from tf_transformer.search.beam_search import BeamSearchResult
from tf_transformer.search.state import SymbolsToLogitsFn

# Smaller sub-batches cost more than the idle time they fill (BUILD.md, performance decisions).
MIN_SENTENCES_PER_SEARCH = 8
# The search's inputs once alpha and extra_length are resolved (no -1 defaults).
_SEARCH_INPUTS = [signatures.IDS, tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)]


def searches_per_batch(decode_config: DecodeConfig, device_type: str) -> int:
    """Searches a graph-mode batch is split into: `parallel_searches` on a CPU, whose
    cores the executor fills with the searches' interleaved small ops; one on a GPU,
    where every search's ops queue on the same stream and a split only adds loops."""
    return 1 if device_type == "GPU" else int(decode_config.parallel_searches)


class Translator(tf.Module):
    """Beam-search translation of a batch, strings to strings, in the graph.

    Args:
      model: a built Transformer (inference only: no dropout is applied).
      tokenizer: the model's shared vocabulary, or a TokenizerPair (source,
        target). `tokenizer` then names the source side's, `target_tokenizer`
        the target side's (the same object when shared).
      decode_config: beam_size and nbest (fixed), alpha and extra_length (defaults).
      max_source_length: source tokens the model accepts, EOS included
        (config.data.max_length); capped at model.max_positions.
      decode_step: the search's symbols_to_logits_fn, by default the model's
        (model_search.py); tools wrap it to count steps.
      device_type: "CPU" or "GPU", where the search runs (`searches_per_batch`);
        default: where TensorFlow places it (a GPU if one is visible).
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer | TokenizerPair,
                 decode_config: DecodeConfig,
                 max_source_length: int, name: str | None = None,
                 decode_step: SymbolsToLogitsFn | None = None,
                 device_type: str | None = None):
        super().__init__(name=name)
        if max_source_length < 2:
            raise ValueError("max_source_length must leave room for one token and EOS")
        self.model = model
        self.tokenizer, self.target_tokenizer = tokenizer_lib.sides(tokenizer)
        self.beam_size = int(decode_config.beam_size)
        self.nbest = int(decode_config.nbest)
        self.alpha = float(decode_config.alpha)
        self.extra_length = int(decode_config.extra_length)
        self.max_source_length = int(min(max_source_length, model.max_positions))
        self.max_target_length = int(model.max_positions)
        self.jit_compile = bool(decode_config.jit_compile)
        self.parallel_searches = searches_per_batch(decode_config,
                                                    device_type or kernels.device_type())
        decode_step = quantized.decode_step(model, decode_config, decode_step)  # int8's
        self.dtype = quantized.dtype_of(model, decode_step)  # DecodeConfig.dtype's
        # Without a tokenizer (ids in, ids out) no id is forbidden.
        never_ids = (UNK_ID,) if getattr(self.target_tokenizer, "byte_fallback", False) else ()
        self.model_search = ModelSearch(model, self.beam_size, self.max_source_length,
                                        self.max_target_length, decode_step, never_ids,
                                        decode_config.bounded_shapes)
        self._compiled = CompiledSearch(self.model_search)
        # One graph-mode search function per nbest, called by every signature and by
        # every part of a batch: the SavedModel holds one copy of the loop per nbest,
        # not one per caller (each copy cost ~60 MB of the loader's memory).
        self._loops = {str(n): tf.function(functools.partial(self._search, nbest=n),
                                           input_signature=_SEARCH_INPUTS, autograph=False)
                       for n in sorted({1, self.nbest})}

    @classmethod
    def from_model_dir(cls, model_dir: ModelDir, checkpoint: str | None = None,
                       decode_config: DecodeConfig | None = None,
                       average_last: int = 0, config: Config | None = None) -> "Translator":
        """The Translator of `model_dir` (model_dir.load_model picks the weights).

        `decode_config` defaults to the one in config.json; `config` is
        config.json when the caller has read it already (it is read once). The
        checkpoints the weights come from are kept in `checkpoint_paths`, config.json's
        Config in `config`.
        """
        config = config or model_dir.read_config()
        decode_config = decode_config or config.decode
        config, model, paths = load_model(model_dir, checkpoint, average_last, config=config,
                                          dtype=quantized.model_dtype(decode_config.dtype))
        logging.info("restored %s", ", ".join(paths))
        tokenizer = tokenizer_lib.load(*model_dir.vocab_paths())
        translator = cls(model, tokenizer, decode_config, config.data.max_length)
        translator.checkpoint_paths = tuple(paths)
        translator.config = config
        return translator

    # -- graph methods (exported) -----------------------------------------
    @tf.function(autograph=False, input_signature=[signatures.TEXT])
    def source_ids(self, text: tf.Tensor) -> tf.Tensor:
        """[B] strings -> int32 [B, S]: tokens cut to max_source_length - 1, EOS, PAD after."""
        return self._source_ids(self.tokenizer.tokenize(text))

    @tf.function(autograph=False, input_signature=[signatures.IDS, signatures.ALPHA, signatures.EXTRA])
    def translate_ids(self, source_ids: tf.Tensor, alpha=-1.0, extra_length=-1) -> dict:
        """source_ids int32 [B, S <= max_source_length] (rows end with EOS, PAD after) ->
        {"ids": int32 [B, nbest, T] (EOS kept, PAD after), "scores": float32 [B, nbest],
         "lengths": int32 [B, nbest] (tokens, EOS included)}."""
        result = self.search(source_ids, self._alpha(alpha), self._extra(extra_length), self.nbest)
        return {"ids": result.ids, "scores": result.scores, "lengths": result.lengths}

    @tf.function(autograph=False, input_signature=[signatures.TEXT, signatures.ALPHA, signatures.EXTRA])
    def translate(self, text: tf.Tensor, alpha=-1.0, extra_length=-1) -> dict:
        """[B] strings -> {"translation": [B] string, "score": float32 [B],
        "length": int32 [B] (target tokens, EOS included)}: the best hypothesis."""
        strings, scores, lengths = self._translate_text(text, alpha, extra_length, nbest=1)
        return {"translation": strings[:, 0], "score": scores[:, 0], "length": lengths[:, 0]}

    @tf.function(autograph=False, input_signature=[signatures.TEXT, signatures.ALPHA, signatures.EXTRA])
    def translate_nbest(self, text: tf.Tensor, alpha=-1.0, extra_length=-1) -> dict:
        """[B] strings -> {"translations": [B, nbest] string, "scores": float32 [B, nbest],
        "lengths": int32 [B, nbest]}, best first."""
        strings, scores, lengths = self._translate_text(text, alpha, extra_length, self.nbest)
        return {"translations": strings, "scores": scores, "lengths": lengths}

    # -- the shared path ---------------------------------------------------
    def search(self, source_ids: tf.Tensor, alpha, extra_length, nbest: int) -> BeamSearchResult:
        """Beam search over the model's incremental decoder (callable in any graph):
        a cache grown by chunks, as `parallel_searches` sub-batches when the batch
        is large enough, or with jit_compile the compiled search (compiled_search.py)."""
        if self.jit_compile:
            return self._compiled(source_ids, alpha, extra_length, nbest)
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        parts = self.parallel_searches
        if parts == 1:
            return self._loop(nbest)(source_ids, alpha, extra_length)
        return tf.cond(tf.shape(source_ids)[0] >= parts * MIN_SENTENCES_PER_SEARCH,
                       lambda: self._parallel_search(source_ids, alpha, extra_length, nbest),
                       lambda: self._loop(nbest)(source_ids, alpha, extra_length))

    def _parallel_search(self, source_ids, alpha, extra_length, nbest) -> BeamSearchResult:
        """`parallel_searches` searches over interleaved sub-batches: rank r of the
        sources sorted by length goes to search r % parts, so every search runs
        about as many steps. Nothing joins them but the final stitch, so the
        executor interleaves their ops; results come back in input order."""
        lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)
        order = tf.argsort(lengths, stable=True)
        parts = self.parallel_searches
        indices = [order[i::parts] for i in range(parts)]
        results = []
        for index in indices:
            width = tf.reduce_max(tf.gather(lengths, index))
            results.append(self._loop(nbest)(tf.gather(source_ids, index)[:, :width], alpha,
                                             extra_length))
        width = tf.reduce_max(tf.stack([tf.shape(r.ids)[2] for r in results]))
        ids = [tf.pad(r.ids, [[0, 0], [0, 0], [0, width - tf.shape(r.ids)[2]]],
                      constant_values=PAD_ID) for r in results]
        return BeamSearchResult(ids=tf.dynamic_stitch(indices, ids),
                                scores=tf.dynamic_stitch(indices, [r.scores for r in results]),
                                lengths=tf.dynamic_stitch(indices, [r.lengths for r in results]))

    def _loop(self, nbest: int):
        """The search function of `nbest` (`_search` itself for another nbest)."""
        return self._loops.get(str(nbest), functools.partial(self._search, nbest=nbest))

    def _search(self, source_ids, alpha, extra_length, nbest) -> BeamSearchResult:
        return self.model_search.run(source_ids, alpha, extra_length, nbest)  # graph mode

    def max_lengths(self, source_ids, extra_length) -> tf.Tensor:
        """int32 [batch]: each source's token count + extra_length, capped (module docstring)."""
        return self.model_search.max_lengths(source_ids, extra_length)

    def _alpha(self, alpha):
        alpha = tf.cast(alpha, tf.float32)
        return tf.where(alpha < 0.0, tf.constant(self.alpha, tf.float32), alpha)

    def _extra(self, extra_length):
        extra_length = tf.cast(extra_length, tf.int32)
        return tf.where(extra_length < 0, self.extra_length, extra_length)

    def _source_ids(self, tokens: tf.RaggedTensor) -> tf.Tensor:
        tokens = tokens[:, :self.max_source_length - 1]
        eos = tf.fill(tf.stack([tokens.nrows(), 1]), tf.constant(EOS_ID, tokens.dtype))
        return tf.concat([tokens, eos], axis=1).to_tensor(default_value=PAD_ID)

    def _translate_text(self, text, alpha, extra_length, nbest):
        tokens = self.tokenizer.tokenize(text)
        result = self.search(self._source_ids(tokens), self._alpha(alpha),
                             self._extra(extra_length), nbest)
        return self._texts(tokens, result, nbest)

    # -- scoring, sampling, alignments ----------------------------------------
    @tf.function(autograph=False, input_signature=[signatures.SOURCE, signatures.TARGET, signatures.ALPHA])
    def score(self, source: tf.Tensor, target: tf.Tensor, alpha=-1.0) -> dict:
        """[B] source and target strings -> scoring.score_pairs' figures, [B] each:
        log_prob, tokens (target tokens with EOS), log_prob_per_token, score. Sources
        are prepared as for translate, targets tokenized by the target vocabulary and
        cut to max_target_length - 1 tokens."""
        target_ids = self.target_tokenizer.tokenize(target).to_tensor(default_value=PAD_ID)
        return self.score_ids(self.source_ids(source), target_ids,
                              alpha)

    @tf.function(autograph=False, input_signature=[signatures.IDS, signatures.TARGET_IDS, signatures.ALPHA])
    def score_ids(self, source_ids: tf.Tensor, target_ids: tf.Tensor, alpha=-1.0) -> dict:
        """source_ids int32 [B, S] (as translate_ids takes them), target_ids int32 [B, T]
        (tokens, then EOS or PAD: translate_ids' ids are taken as they are) -> `score`'s."""
        return scoring.score_pairs(self.model, source_ids, target_ids, self._alpha(alpha),
                                   self.max_target_length)

    @tf.function(autograph=False, input_signature=[signatures.TEXT, signatures.TOPK, signatures.TOPP,
                                  signatures.TEMPERATURE, signatures.SEED])
    def sample(self, text: tf.Tensor, sampling_topk=0, sampling_topp=0.0,
               sampling_temperature=0.0, seed=0) -> dict:
        """[B] strings -> one output drawn per input (search/sampling.py), as `translate`
        gives them: {"translation", "score" (log P / lp), "length"} [B] each. Top-k off
        at <= 0, top-p off outside (0, 1), temperature 1 at <= 0; the same seed and
        batch give the same outputs."""
        return self._sample(text, sampling_topk, sampling_topp, sampling_temperature, seed)

    def _sample(self, text, sampling_topk, sampling_topp, sampling_temperature, seed,
                prefix: prefix_lib.TargetPrefix | None = None) -> dict:
        tokens = self.tokenizer.tokenize(text)
        temperature = tf.cast(sampling_temperature, tf.float32)
        result = self.model_search.sample(
            self._source_ids(tokens), tf.constant(self.alpha, tf.float32),
            tf.constant(self.extra_length), sampling_topk, sampling_topp,
            tf.where(temperature > 0.0, temperature, 1.0), seed, prefix)
        strings, scores, lengths = self._texts(tokens, result, nbest=1)
        return {"translation": strings[:, 0], "score": scores[:, 0], "length": lengths[:, 0]}

    @tf.function(autograph=False, input_signature=[signatures.TEXT, signatures.PREFIX,
                                                   signatures.ALPHA, signatures.EXTRA])
    def translate_with_prefix(self, text: tf.Tensor, prefix: tf.Tensor, alpha=-1.0,
                              extra_length=-1) -> dict:
        """`translate`'s outputs, each output starting with its `prefix` [B] (target text, ""
        for none; search/prefix.py): the prefix's pieces forced, then the free search."""
        tokens = self.tokenizer.tokenize(text)
        result = self.model_search.run(self._source_ids(tokens), self._alpha(alpha),
                                       self._extra(extra_length), 1, prefix=self._prefix(prefix))
        strings, scores, lengths = self._texts(tokens, result, nbest=1)
        return {"translation": strings[:, 0], "score": scores[:, 0], "length": lengths[:, 0]}

    @tf.function(autograph=False, input_signature=[signatures.TEXT, signatures.PREFIX, signatures.TOPK,
                                                   signatures.TOPP, signatures.TEMPERATURE, signatures.SEED])
    def sample_with_prefix(self, text: tf.Tensor, prefix: tf.Tensor, sampling_topk=0,
                           sampling_topp=0.0, sampling_temperature=0.0, seed=0) -> dict:
        """`sample`'s outputs, each output starting with its `prefix` (translate_with_prefix's)."""
        return self._sample(text, sampling_topk, sampling_topp, sampling_temperature, seed,
                            self._prefix(prefix))

    def _prefix(self, prefix: tf.Tensor) -> prefix_lib.TargetPrefix:
        tokens = self.target_tokenizer.tokenize(prefix)[:, :self.max_target_length - 1]  # + EOS
        return prefix_lib.from_ids(tokens.to_tensor(default_value=PAD_ID))

    @tf.function(autograph=False, input_signature=[signatures.TEXT, signatures.ALPHA, signatures.EXTRA])
    def translate_with_alignments(self, text: tf.Tensor, alpha=-1.0, extra_length=-1) -> dict:
        """`translate`'s outputs for the best hypothesis and its alignment:
        {"translation", "translation_unk_replaced" (alignments.py) [B] strings, "score",
         "length", "alignment" float32 [B, T, S] (row t: target token t, EOS last if it
         ended by one; column s: source token s, EOS last; zero padding),
         "target_tokens" int32 [B] (rows before EOS), "source_length" int32 [B]
         (source tokens with EOS, 0 for an empty input)}."""
        out = self._aligned_text(text, alpha, extra_length, nbest=1)
        return {"translation": out["translations"][:, 0],
                "translation_unk_replaced": out["translations_unk_replaced"][:, 0],
                "score": out["scores"][:, 0], "length": out["lengths"][:, 0],
                "alignment": out["alignments"][:, 0], "target_tokens": out["target_tokens"][:, 0],
                "source_length": out["source_lengths"]}

    @tf.function(autograph=False, input_signature=[signatures.TEXT, signatures.ALPHA, signatures.EXTRA])
    def translate_nbest_with_alignments(self, text: tf.Tensor, alpha=-1.0,
                                        extra_length=-1) -> dict:
        """translate_with_alignments for the nbest hypotheses: "translations",
        "translations_unk_replaced", "scores", "lengths", "target_tokens" [B, nbest],
        "alignments" [B, nbest, T, S], "source_lengths" [B]."""
        return self._aligned_text(text, alpha, extra_length, self.nbest)

    def _aligned_text(self, text, alpha, extra_length, nbest) -> dict:
        cut = slice(None, self.max_source_length - 1)
        tokens, starts, ends = (t[:, cut] for t in self.tokenizer.tokenize_with_offsets(text))
        result = self.model_search.run(self._source_ids(tokens), self._alpha(alpha),
                                       self._extra(extra_length), nbest, alignments=True)
        strings, scores, lengths = self._texts(tokens, result, nbest)
        return {**alignments.aligned_outputs(strings, result, text, tokens, starts, ends),
                "scores": scores, "lengths": lengths}

    def _texts(self, tokens: tf.RaggedTensor, result, nbest: int):
        """A search's hypotheses detokenized, [B, nbest]; "" (score 0, length 0) for an
        input without tokens."""
        empty = tokens.row_lengths() == 0
        batch = tf.shape(result.ids)[0]
        flat = tf.reshape(result.ids, tf.stack([batch * nbest, -1]))
        strings = tf.reshape(self.target_tokenizer.detokenize(flat), tf.stack([batch, nbest]))
        empty = empty[:, tf.newaxis]
        return (tf.where(empty, "", strings), tf.where(empty, 0.0, result.scores),
                tf.where(empty, 0, result.lengths))
