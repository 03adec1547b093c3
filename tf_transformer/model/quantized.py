"""int8 decoding: a Transformer's decoding step with int8 projections (`--dtype=int8`).

A decoding step is a few small products per layer over the batch's beam rows,
then the output layer over the whole vocabulary, the largest product of the
step. The output layer (the shared embedding's transpose) runs as oneDNN's
quantized matmul (model/kernels.py `quantized_matmul`: int8 x int8 accumulated in
int32, on the CPU's AMX tiles where it has them, dequantized by the weights'
scales in the same kernel), and with `Int8Step(layers=True)` so do the decoder
layers' projections: self-attention's fused q/k/v and its output,
cross-attention's query and output, both FFN products (off by default: measured
slower, see Int8Step).

Weights: per output channel, symmetric, round(63 w / max|w| of the channel) (7 bits,
WEIGHT_LEVELS: why below), quantized once when the step is made (`Int8Step`), kept
as constants: an exported graph carries them, restored with the graph, and the float copies of
the model stay where they were (the `score` signature's teacher-forced pass
reads them). Activations: per row, symmetric over the row's own range, quantized
at every call (kernels.quantize_rows); each output row is then multiplied by its
input row's range, and the bias and ReLU follow. oneDNN's kernel takes one
activation scale per tensor, which would fuse the whole epilogue, but a row's
values would then depend on the other rows of the batch (measured: a sentence's
translation changed with its batch-mates); per row, they do not.

Why 7-bit weights: on a CPU without VNNI or AMX-int8 (AVX2, AVX-512 without VNNI)
oneDNN's int8 kernel shifts the activations to unsigned (x + 128, up to 255) and
sums pairs of u8 x s8 products in int16 (vpmaddubsw), which saturates above 32767:
with weights up to 127 a pair reaches 64770 and the product is silently wrong
(measured on an AVX2 EPYC: half of a random integer product's outputs off by up
to 27,008 of ~60,000). With weights up to 63 a pair is at most 255 * 63 * 2 = 32130:
exact on every kernel oneDNN picks, so an export quantized on one CPU serves
the same on any other. It costs the weights one bit (error at most 1/126 of the
channel's range, the activations' 1/254 of the row's).

What stays in the model's dtype (bfloat16 for an int8 Translator,
`MODEL_DTYPE`): the embedding, the decoder layers' projections (but with
`layers`), attention's score and context products and its softmax (on the step
policy of kernels.for_inference, float32 logits), the layer norms and residuals,
the encoder and the memory's key/value projections (once per sentence, on AMX in
bfloat16; int8 there was not measured). Logits, scores and the search stay
float32. XLA has no quantized matmul: int8 decodes in graph mode only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.config import DecodeConfig
from tf_transformer.model import cache as caches
from tf_transformer.model import kernels as kernels_lib
from tf_transformer.model import shapes
from tf_transformer.model.cache import DecoderCache

INT8 = "int8"
WEIGHT_LEVELS = 63  # weights round(63 w / range): exact without VNNI (module docstring)
MODEL_DTYPE = "bfloat16"  # the dtype of an int8 Translator's model (what is not quantized)


class QuantizedWeight(NamedTuple):
    """A [k, n] kernel as int8: values int8 [k, n] (within +-WEIGHT_LEVELS), ranges
    float32 [n] (the kernel's range of each output channel, on its scale of 127 levels:
    w ~ values * ranges / 127, ranges = max |w| * 127 / WEIGHT_LEVELS) and their
    negatives, its bias float32 [n] or None, and float32 zeros [n] (the kernel's fused
    bias: see `linear`)."""

    values: tf.Tensor
    ranges: tf.Tensor
    negative_ranges: tf.Tensor
    bias: tf.Tensor | None
    zeros: tf.Tensor


def quantize_weight(kernel, bias=None) -> QuantizedWeight:
    """Per-channel symmetric int8 of a [k, n] kernel (channels: its n columns) over
    +-WEIGHT_LEVELS, and its bias, as constants. A zero column keeps values 0."""
    kernel = np.asarray(kernel, np.float32)
    limits = np.abs(kernel).max(axis=0)
    limits = np.where(limits > 0, limits, 1.0)
    values = np.clip(np.rint(kernel * (WEIGHT_LEVELS / limits)), -WEIGHT_LEVELS,
                     WEIGHT_LEVELS).astype(np.int8)
    ranges = (limits * (127.0 / WEIGHT_LEVELS)).astype(np.float32)
    bias = None if bias is None else tf.constant(np.asarray(bias, np.float32))
    return QuantizedWeight(tf.constant(values), tf.constant(ranges), tf.constant(-ranges), bias,
                           tf.zeros([kernel.shape[1]]))


def dequantized(weight: QuantizedWeight) -> np.ndarray:
    """The float32 [k, n] kernel `weight` stands for."""
    values = weight.values.numpy().astype(np.float32)
    return values * weight.ranges.numpy() / 127.0


def linear(x: tf.Tensor, weight: QuantizedWeight, relu: bool = False,
           dtype: tf.DType | None = None) -> tf.Tensor:
    """relu?(x W + b) over the last axis: [..., k] -> [..., n] in `dtype` (x's by
    default). Each row of x is quantized on its own range (kernels.quantize_rows);
    oneDNN's quantized matmul applies the weights' scales to the int32 sums, then each
    row's range and the bias are applied here (oneDNN's scale of the activations is one
    per tensor; one per row keeps a sentence's translation independent of its batch)."""
    k, n = weight.values.shape
    # A decoding step is a chain of small ops, the executor's time as much as the
    # products': a 2-D x is not reshaped, nor a float32 one cast (tf.cast adds no op).
    rows = tf.cast(x, tf.float32) if x.shape.rank == 2 else tf.reshape(
        tf.cast(x, tf.float32), [-1, k])
    rows, ranges = kernels_lib.quantize_rows(rows)
    y = kernels_lib.quantized_matmul(rows, weight.values, weight.negative_ranges,
                                     weight.ranges, weight.zeros,
                                     weights_constant=not tf.executing_eagerly())
    y = y * ranges
    if weight.bias is not None:
        y = tf.nn.bias_add(y, weight.bias)
    if relu:
        y = tf.nn.relu(y)
    if x.shape.rank != 2:
        y = tf.reshape(y, shapes.dims(x, -1) + [n])
    return tf.cast(y, dtype or x.dtype)


class LayerWeights(NamedTuple):
    """One decoder layer's quantized projections."""

    qkv: QuantizedWeight
    self_output: QuantizedWeight
    query: QuantizedWeight
    cross_output: QuantizedWeight
    inner: QuantizedWeight
    outer: QuantizedWeight


def _layer_weights(layer) -> LayerWeights:
    def q(kernel, bias):
        return quantize_weight(tf.cast(kernel, tf.float32).numpy(),
                               tf.cast(bias, tf.float32).numpy())

    own, cross, ffn = layer.self_attention, layer.cross_attention, layer.feed_forward
    return LayerWeights(q(own.qkv_kernel, own.qkv_bias), q(own.output_kernel, own.output_bias),
                        q(cross.query_kernel, cross.query_bias),
                        q(cross.output_kernel, cross.output_bias),
                        q(ffn.inner_kernel, ffn.inner_bias), q(ffn.outer_kernel, ffn.outer_bias))


class Int8Step:
    """A Transformer's `decode_step` (its contract: model.decode_step's, without
    `kernels`) with the output layer in int8 and, with `layers`, every projection of
    the decoder layers too; everything else is the model's own layers on the step
    policy of its compute dtype. The weights are quantized here, once: build it
    eagerly (as a Translator is built).

    `layers` is off for a Translator (`decode_step`): a step is a chain of small ops
    whose executor time outweighs its products (bench/results/decoding.md), and each
    int8 projection adds ~10 ops (casts, the rows' ranges, quantization, the epilogue)
    to a bfloat16 projection's 3; at d_model 256 the layers' int8 projections made
    the export 1.2x slower than bfloat16's, the output layer alone (256 x 8000, the
    step's largest product) 1.08x faster."""

    def __init__(self, model, layers: bool = False):
        kernels_lib.require_quantized_matmul()
        self.model = model
        self.kernels = kernels_lib.for_inference(model.compute_dtype).step
        self.layers = (tuple(_layer_weights(layer) for layer in model.decoder.layers)
                       if layers else None)
        table = model.target_embedding.token_embedding.embeddings  # [vocab, d_model]
        self.output = quantize_weight(tf.cast(table, tf.float32).numpy().T)

    def __call__(self, ids, step, cache: DecoderCache, with_attention: bool = False):
        """Logits float32 [batch, vocab] for the token after ids[:, step], the cache with
        position `step` written, and with `with_attention` the last layer's
        cross-attention averaged over heads, float32 [batch, S] (model.decode_step's)."""
        model = self.model
        vectors = None
        if caches.made(cache.position_table):
            vectors = cache.position_table[step][tf.newaxis]
        x = model.target_embedding(ids[:, step][:, tf.newaxis], start_index=step,
                                   position_vectors=vectors)
        if self.layers is None:  # the layers on the model's own step, the output layer int8
            out = model.decoder.step(x, step, cache, self.kernels, with_attention)
            logits = linear(out[0][:, 0], self.output, dtype=tf.float32)
            cache = cache._replace(self_attention=out[1])
            return (logits, cache, out[2]) if with_attention else (logits, cache)
        new_self, attention = [], None
        for i, (layer, weights) in enumerate(zip(model.decoder.layers, self.layers)):
            last = with_attention and i == model.num_layers - 1
            x, layer_cache, aligned = self._layer_step(
                layer, weights, x, step, cache.self_attention[i], cache.memory_keys[i],
                cache.memory_values[i], cache.memory_bias, last)
            new_self.append(layer_cache)
            attention = aligned if last else attention
        y = model.decoder.normalize_output(x)
        logits = linear(y[:, 0], self.output, dtype=tf.float32)
        cache = cache._replace(self_attention=tuple(new_self))
        return (logits, cache, attention) if with_attention else (logits, cache)

    def _layer_step(self, layer, weights: LayerWeights, x, step, self_cache, memory_keys,
                    memory_values, memory_bias, with_attention: bool):
        """DecoderLayer.step with int8 projections -> (y, self cache, alignment or None)."""
        written, aligned = [], []

        def self_attend(y):
            own = layer.self_attention
            hk = own.num_heads * own.d_k
            q, k, v = tf.split(linear(y, weights.qkv), [hk, hk, own.num_heads * own.d_v], -1)
            q, k, v = (own.split_heads(q, own.d_k), own.split_heads(k, own.d_k),
                       own.split_heads(v, own.d_v))
            cache = self_cache.write(tf.cast(k, self_cache.keys.dtype),
                                     tf.cast(v, self_cache.values.dtype), step)
            written.append(cache)
            return self._attend(own, weights.self_output, q, cache.keys, cache.values,
                                cache.bias(step))[0]

        def cross_attend(y):
            cross = layer.cross_attention
            batch = memory_keys.shape[0]
            batch = tf.shape(memory_keys)[0] if batch is None else batch
            q = tf.reshape(linear(y, weights.query), [batch, -1, cross.num_heads, cross.d_k])
            rows = shapes.dims(y, 2)
            out, probabilities = self._attend(cross, weights.cross_output,
                                              tf.transpose(q, [0, 2, 1, 3]), memory_keys,
                                              memory_values, memory_bias, rows)
            if with_attention:  # [batch, h, group, S] -> [rows, S]: CrossAttention.step's
                mean = tf.reduce_mean(probabilities, axis=1)
                aligned.append(tf.reshape(mean, rows + [tf.shape(mean)[-1]])[:, 0])
            return out

        def feed_forward(y):  # one reshape each way; the hidden rows stay float32
            rows = tf.reshape(y, [-1, y.shape[-1]])
            hidden = linear(rows, weights.inner, relu=True, dtype=tf.float32)
            return tf.reshape(linear(hidden, weights.outer, dtype=y.dtype), tf.shape(y))

        x = layer.sublayer("self_attention", x, self_attend, False)
        x = layer.sublayer("cross_attention", x, cross_attend, False)
        x = layer.sublayer("feed_forward", x, feed_forward, False)
        return x, written[0], aligned[0] if aligned else None

    def _attend(self, attention, output: QuantizedWeight, q, k, v, bias, rows=None):
        """_Attention.attend (no dropout) with its output projection in int8 ->
        (output, the attention weights float32 [b, h, T, S])."""
        probabilities = attention.attention_weights(q, k, bias, self.kernels)
        heads = self.kernels.attention(tf.cast(probabilities, v.dtype), v)  # [b, h, T, d_v]
        width = attention.num_heads * attention.d_v
        if heads.shape[2] == 1 and rows is None:  # one query: a reshape
            heads = tf.reshape(heads, shapes.dims(heads, 1) + [1, width])
        else:
            heads = tf.reshape(tf.transpose(heads, [0, 2, 1, 3]),
                               (rows or shapes.dims(heads, 2)) + [width])
        return linear(heads, output), probabilities


def model_dtype(decode_dtype: str) -> str:
    """The dtype a Translator's model is loaded in for DecodeConfig.dtype `decode_dtype`."""
    return MODEL_DTYPE if decode_dtype == INT8 else decode_dtype


def dtype_of(model, step) -> str:
    """A Translator's DecodeConfig.dtype: int8 with an `Int8Step`, else its model's."""
    return INT8 if isinstance(step, Int8Step) else str(model.compute_dtype)


def decode_step(model, decode_config: DecodeConfig, given=None):
    """The step a Translator searches with: `given` (a tool's) if any, else for
    `--dtype=int8` an `Int8Step` of `model` (None: the model's own step). Raises
    ConfigError on a TensorFlow build without oneDNN's quantized matmul (DecodeConfig
    refuses int8 with jit_compile: XLA has no quantized matmul)."""
    if given is not None or decode_config.dtype != INT8:
        return given
    return Int8Step(model)
