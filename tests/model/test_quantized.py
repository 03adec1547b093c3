"""model/quantized.py and kernels.quantized_matmul: the int8 product is the per-channel
int8 arithmetic (exact on integers, within the dequantization bound of the float
product), and an int8 step is the model's step with its projections in int8."""

import numpy as np
import pytest
import tensorflow as tf
from layer_fixtures import TINY, random_batch

from tf_transformer.config import ConfigError, DecodeConfig
from tf_transformer.model import build_model, cache, kernels, quantized


def _graph(function):
    return tf.function(function, autograph=False)


@pytest.fixture(scope="module")
def model():
    return build_model(TINY)


@pytest.fixture(scope="module")
def int8_step(model):
    """Every projection of the step in int8 (a Translator's step has the output layer's)."""
    return quantized.Int8Step(model, layers=True)


def _float_reference(x, kernel, bias, relu):
    y = x.astype(np.float64) @ kernel.astype(np.float64) + bias
    return np.maximum(y, 0) if relu else y


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_the_kernel_accumulates_integers_exactly(mode):
    """int8 rows (scale 1/127) times columns of quantized.WEIGHT_LEVELS (range 127: scale
    1): the float32 output times 127 is the integer product, recovered exactly, on every
    CPU. The last rows and columns are the extremes where a CPU without VNNI saturates
    its int16 pair sums for weights over 63: rows of +-127 against columns of +-63."""
    levels = quantized.WEIGHT_LEVELS
    rng = np.random.default_rng(0)
    x = rng.integers(-127, 128, size=(6, 40)).astype(np.int8)
    kernel = rng.integers(-levels, levels + 1, size=(40, 24)).astype(np.int8)
    x[-2], x[-1] = 127, -127
    kernel[:, -2], kernel[:, -1] = levels, -levels
    ranges = np.full(24, 127.0, np.float32)
    integers = x.astype(np.int64) @ kernel.astype(np.int64)

    def product(x):
        return kernels.quantized_matmul(tf.bitcast(x, tf.qint8), tf.constant(kernel),
                                        tf.constant(-ranges), tf.constant(ranges),
                                        tf.zeros([24]), weights_constant=mode == "graph")

    got = (product if mode == "eager" else _graph(product))(tf.constant(x)).numpy()
    np.testing.assert_array_equal(np.rint(got.astype(np.float64) * 127), integers)
    np.testing.assert_allclose(got, integers / 127, rtol=1e-6)


@pytest.mark.parametrize("relu", [False, True])
def test_integer_valued_rows_and_columns_are_their_own_int8(relu):
    """Rows whose range is 127 and columns whose range is WEIGHT_LEVELS quantize to
    themselves: the product is the integer product plus bias, to float32 rounding."""
    levels = quantized.WEIGHT_LEVELS
    rng = np.random.default_rng(3)
    x = rng.integers(-127, 128, size=(5, 32)).astype(np.float32)
    x[:, 0] = 127.0
    kernel = rng.integers(-levels, levels + 1, size=(32, 16)).astype(np.float32)
    kernel[0] = -levels
    bias = rng.integers(-1000, 1000, size=16).astype(np.float32)
    weight = quantized.quantize_weight(kernel, bias)
    np.testing.assert_array_equal(weight.values.numpy(), kernel.astype(np.int8))
    rows, ranges = kernels.quantize_rows(tf.constant(x))
    np.testing.assert_array_equal(tf.bitcast(rows, tf.int8).numpy(), x.astype(np.int8))
    np.testing.assert_array_equal(ranges.numpy(), np.full((5, 1), 127.0))
    got = _graph(lambda x: quantized.linear(x, weight, relu=relu))(tf.constant(x)).numpy()
    np.testing.assert_allclose(got, _float_reference(x, kernel, bias, relu), rtol=1e-6,
                               atol=1e-3)


def test_weights_are_per_channel_symmetric_int8():
    rng = np.random.default_rng(1)
    kernel = rng.normal(size=(16, 8)).astype(np.float32) * np.geomspace(1e-3, 10, 8)
    kernel[:, 3] = 0.0  # a zero channel
    weight = quantized.quantize_weight(kernel)
    values = weight.values.numpy()
    assert values.dtype == np.int8
    levels = quantized.WEIGHT_LEVELS
    assert levels == 63  # the most a CPU without VNNI sums exactly (module docstring)
    assert np.abs(values).max(axis=0).tolist() == [levels] * 3 + [0] + [levels] * 4
    limits = np.abs(kernel).max(axis=0)
    np.testing.assert_allclose(weight.ranges.numpy()[[0, 7]], limits[[0, 7]] * 127 / levels)
    np.testing.assert_array_equal(weight.negative_ranges.numpy(), -weight.ranges.numpy())
    error = np.abs(quantized.dequantized(weight) - kernel)
    assert np.all(error <= limits / (2 * levels) * (1 + 1e-5))


@pytest.mark.parametrize("relu", [False, True])
def test_the_product_is_the_numpy_int8_reference_and_within_its_bound(relu):
    """Random floats: the kernel computes the per-row (activations) x per-channel
    (weights) int8 product, dequantized, to float32 rounding; it differs from the float
    product by at most the dequantization bound sum_i |x_ri| dw_j + |w_ij| dx_r + dx_r dw_j
    (dx_r = max|x_r| / 254, dw_j = range_j / 254)."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(33, 64)).astype(np.float32)
    kernel = (rng.normal(size=(64, 48)) * 0.1).astype(np.float32)
    bias = rng.normal(size=48).astype(np.float32)
    weight = quantized.quantize_weight(kernel, bias)
    got = _graph(lambda x: quantized.linear(x, weight, relu=relu))(tf.constant(x)).numpy()

    x[3] *= 50.0  # a row of another range: the other rows keep their own scales
    x[4] *= 1e-4  # and a row of a tiny range (QuantizeV2 widens ranges under 0.01 by default)
    limit = np.abs(x).max(axis=1, keepdims=True)
    x_int = np.rint(x * 127 / limit)
    ranges = weight.ranges.numpy()
    integers = x_int.astype(np.int64) @ weight.values.numpy().astype(np.int64)
    reference = integers * (limit / 127) * (ranges / 127) + bias
    reference = np.maximum(reference, 0) if relu else reference
    got = _graph(lambda x: quantized.linear(x, weight, relu=relu))(tf.constant(x)).numpy()
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-4)
    for rows in (slice(0, 2), slice(4, 5)):  # rows do not see their batch (one row alone)
        alone = _graph(lambda x: quantized.linear(x, weight, relu=relu))(tf.constant(x[rows]))
        np.testing.assert_array_equal(alone.numpy(), got[rows])

    dx, dw = limit / 254, ranges / 254
    bound = np.abs(x) @ np.broadcast_to(dw, kernel.shape) + dx * np.abs(kernel).sum(0) \
        + x.shape[1] * dx * dw
    error = np.abs(got - _float_reference(x, kernel, bias, relu))
    assert np.all(error <= bound * (1 + 1e-4) + 1e-5)
    assert error.max() > 0  # it is int8, not a float product


def test_an_int8_step_is_the_model_step_with_int8_projections(model, int8_step):
    """Logits and the alignment row of each step (eager and in a graph, a growing cache)
    are the float step's within int8's error; the graph's projections are oneDNN's
    quantized matmul on int8 constants (quantized once), none a float MatMul."""
    source, target = random_batch()
    state = model.initial_cache(model.encode(source), source, cache.growing(), True)
    ours = int8_step.__call__
    graph_step = _graph(lambda t, s, c: ours(t, s, c, with_attention=True))
    for step in range(3):
        step = tf.constant(step)
        want, want_cache, want_attention = model.decode_step(target, step, state,
                                                             with_attention=True)
        for run in (lambda *a: ours(*a, with_attention=True), graph_step):
            logits, new_cache, attention = run(target, step, state)
            scale = np.abs(want.numpy()).max()
            np.testing.assert_allclose(logits, want, atol=0.03 * scale)
            assert 0 < np.abs(logits - want).max()
            np.testing.assert_allclose(attention, want_attention, atol=0.02)
            np.testing.assert_allclose(new_cache.self_attention[0].keys,
                                       want_cache.self_attention[0].keys, atol=0.05)
        state = want_cache
    graph = graph_step.get_concrete_function(target, tf.constant(0), state).graph
    types = [op.type for op in graph.get_operations()]
    per_layer = 6  # qkv, self output, cross query, cross output, FFN inner and outer
    assert types.count("_QuantizedMatMul") == per_layer * TINY.num_layers + 1
    assert types.count("QuantizeV2") == types.count("_QuantizedMatMul")  # activations only
    assert not {"MatMul", "BatchMatMulV2"} & set(types)
    weights = [op.inputs[1] for op in graph.get_operations() if op.type == "_QuantizedMatMul"]
    assert all(w.op.type == "Bitcast" and w.op.inputs[0].op.type == "Placeholder"
               and w.op.inputs[0].dtype == tf.int8 for w in weights)  # captured int8 constants


def test_a_translator_step_has_the_output_layer_in_int8(model):
    """quantized.decode_step's step: the layers on the model's own step kernels, the
    output layer oneDNN's quantized matmul, the logits within int8's error."""
    step = quantized.decode_step(model, DecodeConfig(dtype="int8"))
    source, target = random_batch()
    state = model.initial_cache(model.encode(source), source, cache.growing(), True)
    traced = _graph(lambda t, s: step(t, s, state))
    logits, new_cache = traced(target, tf.constant(0))
    want, want_cache = model.decode_step(target, tf.constant(0), state)
    np.testing.assert_allclose(logits, want, atol=0.03 * np.abs(want.numpy()).max())
    np.testing.assert_array_equal(new_cache.self_attention[0].keys,
                                  want_cache.self_attention[0].keys)
    graph = traced.get_concrete_function(target, tf.constant(0)).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("_QuantizedMatMul") == 1 and "BatchMatMulV3" in types
    assert quantized.dtype_of(model, step) == "int8"


def test_an_int8_step_keeps_the_model_dtype_and_float32_logits():
    model = build_model(TINY, dtype="bfloat16")
    source, target = random_batch()
    state = model.initial_cache(model.encode(source), source, cache.growing(), True)
    logits, new_cache = quantized.Int8Step(model, layers=True)(target, tf.constant(0), state)
    assert logits.dtype == tf.float32 and new_cache.self_attention[0].keys.dtype == tf.bfloat16
    want = model.decode_step(target, tf.constant(0), state)[0]
    np.testing.assert_allclose(logits, want, atol=0.05 * np.abs(want.numpy()).max())


def test_a_build_without_the_quantized_matmul_is_refused_by_name(model, monkeypatch):
    """A TensorFlow build without oneDNN registers no _QuantizedMatMul kernel: an int8 step
    is refused at construction with the op's name, not at the first search."""
    registered = kernels.registered_kernels
    monkeypatch.setattr(kernels, "registered_kernels", lambda op: (
        [] if op == kernels.QUANTIZED_MATMUL else registered(op)))
    with pytest.raises(ConfigError, match="_QuantizedMatMul"):
        quantized.decode_step(model, DecodeConfig(dtype="int8"))
    assert quantized.decode_step(model, DecodeConfig(dtype="bfloat16")) is None


def test_int8_is_a_decode_dtype_of_graph_mode_only():
    assert DecodeConfig(dtype="int8").dtype == "int8"
    with pytest.raises(ConfigError, match="int8"):
        DecodeConfig(dtype="int8", jit_compile=True)
    assert quantized.model_dtype("int8") == "bfloat16"
    assert quantized.model_dtype("float32") == "float32"
