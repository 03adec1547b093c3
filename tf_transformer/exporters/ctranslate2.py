"""Conversion of a model directory to CTranslate2's format (`python -m export --format=ctranslate2`).

CTranslate2 (https://github.com/OpenNMT/CTranslate2) is a C++ inference engine
for Transformers. `export_ctranslate2` fills its `TransformerSpec` from our
weights through its Python converter API (a `Converter` subclass whose
`_load()` returns the filled spec), so a model trained here runs in its C++
runtime, and the benchmark can time our SavedModel against it on identical
weights (tests/exporters/test_ctranslate2.py checks that both assign the same
log-probabilities and decode greedily to the same ids).

`ctranslate2` is an optional dependency imported only by this module.

Weight mapping (CTranslate2's LinearSpec weight is [out, in], our kernels are
[in, out], hence the transposes; both split heads the same way, contiguous
blocks of d_k inside each of Q, K, V):

  embedding/token_embedding/embeddings [vocab, d_model]
      -> encoder.embeddings[0].weight, decoder.embeddings.weight, and
         decoder.projection.weight (the tied pre-softmax projection, no bias);
         scale_embeddings multiplies by sqrt(d_model) as we do.
  position table [max_positions, d_model] (our interleaved sinusoids, as the
      model computes them, or the learned table)
      -> {encoder,decoder}.position_encodings.encodings. CTranslate2's own
         default sinusoids are [sin | cos] concatenated, so the table is stored.
  self_attention qkv_kernel [d, 3*h*d_k] ([Q | K | V]), qkv_bias
      -> self_attention.linear[0] (CTranslate2's fused QKV, same order)
  cross_attention query_kernel/bias -> attention.linear[0];
      key_value_kernel/bias ([K | V]) -> attention.linear[1]
  output_kernel/bias -> linear[-1]
  feed_forward inner/outer kernel, bias -> ffn.linear_0, ffn.linear_1
  *_norm gamma/beta -> the layer_norm of the matching sub-layer spec (with
      pre_norm=False CTranslate2 applies it as LayerNorm(x + Sublayer(x)),
      the paper's post-norm; with pre_norm=True before the sub-layer, plus
      the stacks' final norms).

Vocabulary: the SentencePiece pieces in id order, for source and target
(saved once, as shared_vocabulary.json; with separate vocabularies each side's,
as source_vocabulary.json and target_vocabulary.json, the encoder's embeddings
from the source embedding table). CTranslate2 finds its special tokens
by name in that list (config unk_token "<unk>", bos_token and
decoder_start_token "<s>", eos_token "</s>"), so they resolve to our ids
(unk 1, BOS 2, EOS 3); `add_source_eos` appends EOS to every source as our
input pipeline and Translator do. CTranslate2 has no padding token: it masks
by sequence length, so <pad> (id 0) is an ordinary entry that it never reads.
The SentencePiece model travels in the output directory as
`sentencepiece.model` (separate ones as `source_sentencepiece.model` and
`target_sentencepiece.model`).

Decoding differences (see `translate_options`, which covers the first two):
CTranslate2 does not forbid <pad> and <s> as our beam search does (pass them
as suppress_sequences, with <unk> for a target vocabulary with byte
fallback, which our search never generates either); by default it forbids
EOS as the first token, an empty output that our search allows (pass
min_decoding_length=0); its length penalty is score / length**alpha, not
GNMT's score / ((5 + length) / 6)**alpha (the same length, EOS included), so
beam search with alpha > 0 may pick other hypotheses (pinned in the tests).
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DecodeConfig
from tf_transformer.inputs.tokenizer import has_byte_fallback
from tf_transformer.model import Transformer
from tf_transformer.model.layers import SelfAttention
from tf_transformer.model_dir import ModelDir, load_model

try:
    import ctranslate2
    from ctranslate2.converters.converter import Converter
    from ctranslate2.specs import common_spec, transformer_spec
except ImportError as error:  # an optional dependency: say how to get it
    raise ImportError("the CTranslate2 export needs the ctranslate2 package "
                      "(pip install ctranslate2==4.8.5)") from error

SENTENCEPIECE_FILE = "sentencepiece.model"
SOURCE_SENTENCEPIECE_FILE = "source_sentencepiece.model"
TARGET_SENTENCEPIECE_FILE = "target_sentencepiece.model"
METADATA_FILE = "tf_transformer_export.json"
SPECIAL_PIECES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


def vocabulary_pieces(sentencepiece_model: str) -> list[str]:
    """The SentencePiece pieces in id order; ids 0-3 must be <pad> <unk> <s> </s>."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=sentencepiece_model)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    if any(pieces[i] != piece for i, piece in SPECIAL_PIECES.items()):
        raise ValueError(f"{sentencepiece_model}: special pieces {pieces[:4]} are not "
                         f"{list(SPECIAL_PIECES.values())}")
    if len(set(pieces)) != len(pieces):
        raise ValueError(f"{sentencepiece_model} has duplicate pieces")
    return pieces


class TransformerConverter(Converter):
    """CTranslate2 converter of a built `Transformer` (weights already restored).

    Args:
      model: the Transformer.
      pieces: the vocabulary in id order (vocabulary_pieces): the shared one, or
        the target side's when `source_pieces` are given.
      extra_files: {name in the output directory: path} copied alongside.
      source_pieces: a separate source vocabulary (embeddings not shared).
    """

    def __init__(self, model: Transformer, pieces: list[str], extra_files: dict | None = None,
                 source_pieces: list[str] | None = None):
        self._model = model
        self._pieces = pieces
        self._source_pieces = pieces if source_pieces is None else source_pieces
        self._extra_files = extra_files or {}

    def _load(self):
        m = self._model
        if m.d_k != m.d_v or m.d_k * m.num_heads != m.d_model:
            raise NotImplementedError(
                f"CTranslate2 needs d_k = d_v = d_model / h; this model has d_k={m.d_k}, "
                f"d_v={m.d_v}, d_model={m.d_model}, h={m.num_heads}")
        source_size = m.vocab_size if m.share_embeddings else (m.source_vocab_size or m.vocab_size)
        if (len(self._pieces), len(self._source_pieces)) != (m.vocab_size, source_size):
            raise ValueError(f"vocabularies of {len(self._source_pieces)} (source) and "
                             f"{len(self._pieces)} (target) pieces for a model of "
                             f"{source_size} and {m.vocab_size}")
        encoder = transformer_spec.TransformerEncoderSpec(
            m.num_layers, m.num_heads, pre_norm=m.pre_norm,
            activation=common_spec.Activation.RELU)
        decoder = transformer_spec.TransformerDecoderSpec(
            m.num_layers, m.num_heads, pre_norm=m.pre_norm,
            activation=common_spec.Activation.RELU)
        spec = transformer_spec.TransformerSpec(encoder, decoder)
        spec.config.layer_norm_epsilon = float(m.layer_norm_epsilon)
        spec.config.unk_token = SPECIAL_PIECES[UNK_ID]
        spec.config.bos_token = SPECIAL_PIECES[BOS_ID]
        spec.config.eos_token = SPECIAL_PIECES[EOS_ID]
        spec.config.decoder_start_token = SPECIAL_PIECES[BOS_ID]
        spec.config.add_source_bos = False
        spec.config.add_source_eos = True  # source = tokens + [EOS], as in training
        spec.register_source_vocabulary(self._source_pieces)
        spec.register_target_vocabulary(self._pieces)
        for name, path in self._extra_files.items():
            spec.register_file(path, name)

        self._set_embedding(spec.encoder.embeddings[0], spec.encoder, m.source_embedding)
        self._set_embedding(spec.decoder.embeddings, spec.decoder, m.target_embedding)
        spec.decoder.projection.weight = _numpy(m.target_embedding.token_embedding.embeddings)
        for layer_spec, layer in zip(spec.encoder.layer, m.encoder.layers):
            _set_attention(layer_spec.self_attention, layer.self_attention,
                           layer.self_attention_norm)
            _set_ffn(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
        for layer_spec, layer in zip(spec.decoder.layer, m.decoder.layers):
            _set_attention(layer_spec.self_attention, layer.self_attention,
                           layer.self_attention_norm)
            _set_attention(layer_spec.attention, layer.cross_attention, layer.cross_attention_norm)
            _set_ffn(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
        if m.pre_norm:
            _set_norm(spec.encoder.layer_norm, m.encoder.final_norm)
            _set_norm(spec.decoder.layer_norm, m.decoder.final_norm)
        return spec

    def _set_embedding(self, embedding_spec, stack_spec, embedding):
        embedding_spec.weight = _numpy(embedding.token_embedding.embeddings)
        stack_spec.scale_embeddings = True
        # The table as the model computes it (interleaved sinusoids), or the learned one.
        if embedding.positions == "sinusoid":
            table = embedding.position_table(tf.constant(embedding.max_positions))
        else:
            table = embedding.position_encoding.table
        stack_spec.position_encodings.encodings = _numpy(table)


def _numpy(tensor) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(tensor, dtype=np.float32))


def _set_linear(spec, kernel, bias):
    spec.weight = _numpy(kernel).T.copy()  # [in, out] -> CTranslate2's [out, in]
    spec.bias = _numpy(bias)


def _set_norm(spec, norm):
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_attention(spec, attention, norm):
    if isinstance(attention, SelfAttention):
        _set_linear(spec.linear[0], attention.qkv_kernel, attention.qkv_bias)
    else:
        _set_linear(spec.linear[0], attention.query_kernel, attention.query_bias)
        _set_linear(spec.linear[1], attention.key_value_kernel, attention.key_value_bias)
    _set_linear(spec.linear[-1], attention.output_kernel, attention.output_bias)
    _set_norm(spec.layer_norm, norm)


def _set_ffn(spec, feed_forward, norm):
    _set_linear(spec.linear_0, feed_forward.inner_kernel, feed_forward.inner_bias)
    _set_linear(spec.linear_1, feed_forward.outer_kernel, feed_forward.outer_bias)
    _set_norm(spec.layer_norm, norm)


def export_ctranslate2(model_dir: ModelDir, output_dir: str, checkpoint: str | None = None,
                       average_last: int | None = None, quantization: str | None = None,
                       force: bool = False) -> str:
    """Writes `model_dir`'s model as a CTranslate2 model directory; returns `output_dir`.

    Args:
      model_dir: our model directory (config.json, vocab.model, checkpoints).
      output_dir: created (replaced with `force`): model.bin, config.json,
        shared_vocabulary.json, sentencepiece.model and tf_transformer_export.json
        (checkpoints used, our config, suggested decoding options); with
        separate vocabularies source_ and target_vocabulary.json and
        source_ and target_sentencepiece.model instead.
      checkpoint, average_last: which weights, as in the SavedModel export.
      quantization: CTranslate2's weight type (None keeps float32; "int8",
        "int8_float32", "int16", "float16", "bfloat16", ...). Any type can also
        be chosen at load time with ctranslate2.Translator(compute_type=...).
    """
    config, model, paths = load_model(model_dir, checkpoint, average_last or 0)
    source_vocab, target_vocab = model_dir.vocab_paths()
    with open(target_vocab, "rb") as f:
        forbid_unk = has_byte_fallback(f.read())  # as the Translator's search
    metadata = {"model_dir": os.path.abspath(model_dir.path),
                "checkpoints": [os.path.abspath(p) for p in paths],
                "averaged": len(paths) if average_last else 0,
                "quantization": quantization or "float32",
                "ctranslate2_version": ctranslate2.__version__,
                "translate_options": translate_options(config.decode, config.data.max_length,
                                                       forbid_unk),
                "config": json.loads(config.to_json())}
    with tempfile.TemporaryDirectory() as tmp:
        metadata_path = os.path.join(tmp, METADATA_FILE)
        with open(metadata_path, "w") as f:
            json.dump(metadata, f, indent=2, sort_keys=True)
        if source_vocab == target_vocab:
            files, source_pieces = {SENTENCEPIECE_FILE: target_vocab}, None
        else:
            files = {SOURCE_SENTENCEPIECE_FILE: source_vocab,
                     TARGET_SENTENCEPIECE_FILE: target_vocab}
            source_pieces = vocabulary_pieces(source_vocab)
        converter = TransformerConverter(
            model, vocabulary_pieces(target_vocab), {**files, METADATA_FILE: metadata_path},
            source_pieces=source_pieces)
        return converter.convert(output_dir, quantization=quantization, force=force)


def translate_options(decode: DecodeConfig, max_source_length: int | None = None,
                      forbid_unk: bool = False) -> dict:
    """Keyword arguments of ctranslate2.Translator.translate_batch closest to our decoding.

    Same: beam size, n-best, PAD and BOS never generated (and <unk> with
    `forbid_unk`, as our search does for a byte-fallback vocabulary), EOS not returned,
    EOS allowed first (an empty output, as in our search; CTranslate2's default
    min_decoding_length=1 forbids it and would pick another first token).
    Different: `length_penalty` is alpha in CTranslate2's score / length**alpha
    (ours: GNMT's ((5 + length) / 6)**alpha), and `max_decoding_length` is one
    value per batch (ours: each source's length + extra_length), so it is left
    to the caller: max source length in the batch (EOS included) + extra_length.
    """
    options = {"beam_size": decode.beam_size, "num_hypotheses": decode.nbest,
               "length_penalty": decode.alpha, "min_decoding_length": 0,
               "suppress_sequences": [[SPECIAL_PIECES[PAD_ID]], [SPECIAL_PIECES[BOS_ID]]]
               + ([[SPECIAL_PIECES[UNK_ID]]] if forbid_unk else [])}
    if max_source_length:
        options["max_input_length"] = max_source_length
    return options


def run_export(model_dir: ModelDir, export_dir: str, checkpoint: str | None = None,
               average_last: int | None = None, quantization: str | None = None) -> str:
    """What `python -m export --format=ctranslate2` runs: converts into `export_dir`.

    The directory is replaced if it already holds a CTranslate2 model
    (model.bin) and refused if it holds anything else. Returns its path.
    """
    if os.path.isdir(export_dir) and os.listdir(export_dir) and not os.path.exists(
            os.path.join(export_dir, "model.bin")):
        raise FileExistsError(f"{export_dir} is not empty and holds no CTranslate2 model; "
                              "choose another --export_dir")
    return export_ctranslate2(model_dir, export_dir, checkpoint=checkpoint,
                              average_last=average_last or None, quantization=quantization,
                              force=True)
