"""model/kernels.py: each policy puts the products on the kernels it names, with the
same values, and the adapters of TensorFlow's private ops keep their contract (these
tests fail loudly if TensorFlow changes the ops under them)."""

import numpy as np
import pytest
import tensorflow as tf
from layer_fixtures import TINY, random_batch

from tf_transformer.model import build_model, cache, kernels


def _op_types(function, *args) -> set:
    graph = tf.function(function, autograph=False).get_concrete_function(*args).graph
    return {op.type for op in graph.get_operations()}


def test_a_decoding_step_runs_its_products_on_eigen():
    """A step's products, attention, projections and output layer, are BatchMatMulV3 (no
    oneDNN rewrite, so no oneDNN kernel per shape) and its softmax exp(LogSoftmax); the
    full pass keeps MatMul and BatchMatMulV2."""
    model = build_model(TINY)
    source, target = random_batch()
    state = model.initial_cache(model.encode(source), source, cache.chunked(), True)
    step = _op_types(lambda t, s: model.decode_step(t, s, state)[0], target, tf.constant(0))
    assert "BatchMatMulV3" in step and not {"MatMul", "BatchMatMulV2", "Softmax"} & step
    assert "LogSoftmax" in step
    full = _op_types(lambda s, t: model({"source": s, "target_in": t}), source, target)
    assert {"MatMul", "BatchMatMulV2", "Softmax"} <= full and "BatchMatMulV3" not in full


def test_the_training_kernels_make_a_step_plain_tf_matmul():
    """The policy, not the shape, decides: a step given TRAINING runs MatMul, with the
    STEP policy's logits."""
    model = build_model(TINY)
    source, target = random_batch()
    state = model.initial_cache(model.encode(source), source, cache.growing(), True)
    step = tf.constant(0)
    plain = _op_types(lambda t, s: model.decode_step(t, s, state, kernels.TRAINING)[0],
                      target, step)
    assert "MatMul" in plain and "BatchMatMulV3" not in plain
    np.testing.assert_allclose(model.decode_step(target, step, state, kernels.TRAINING)[0],
                               model.decode_step(target, step, state)[0], rtol=1e-5, atol=1e-5)


def test_the_encoding_kernels_run_the_projections_on_eigen():
    """The Translator encodes with ENCODING: its projections become BatchMatMulV3 (no
    oneDNN kernel per source width), attention stays BatchMatMulV2, the memory is the same."""
    model = build_model(TINY)
    source, _ = random_batch()

    def encode(s):
        return model.encode(s, training=False, kernels=kernels.ENCODING)

    types = _op_types(encode, source)
    assert "BatchMatMulV3" in types and "MatMul" not in types and "BatchMatMulV2" in types
    plain = tf.function(lambda s: model.encode(s, training=False), autograph=False)
    assert "MatMul" in _op_types(lambda s: model.encode(s, training=False), source)
    np.testing.assert_allclose(tf.function(encode, autograph=False)(source).numpy(), plain(source).numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("product", [kernels.onednn_matmul, kernels.eigen_matmul])
def test_products_are_x_y_and_x_y_transposed(product):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(2, 3, 5, 6))
    x, y = tf.constant(x, tf.float32), tf.constant(y, tf.float32)
    np.testing.assert_allclose(product(x, y), x.numpy() @ y.numpy(), rtol=1e-5)
    yt = tf.transpose(y, [0, 1, 3, 2])
    np.testing.assert_allclose(product(x, yt, adj_y=True), x.numpy() @ y.numpy(), rtol=1e-5)


def test_exp_log_softmax_is_softmax():
    logits = tf.constant([[0.5, -1.0, 3.0, float("-inf")]])
    np.testing.assert_allclose(kernels.exp_log_softmax(logits), tf.nn.softmax(logits), rtol=1e-6)


def test_write_rows_in_place_writes_the_rows_into_its_input_buffer():
    """The adapter of InplaceUpdate: the given rows set, the others kept, and no copy:
    the output aliases the input's buffer (TensorFlow's op contract; a copy would still
    be correct but lose the point, so a change there fails here)."""
    def write(rows, values):
        matrix = tf.zeros([5, 3]) + 1.0  # a fresh tensor only this write reads
        return kernels.write_rows_in_place(matrix, rows, values)

    out = tf.function(write, autograph=False)(tf.constant([1, 3]), tf.constant([[7.0] * 3, [9.0] * 3]))
    np.testing.assert_array_equal(out, [[1] * 3, [7] * 3, [1] * 3, [9] * 3, [1] * 3])
    types = _op_types(write, tf.constant([1, 3]), tf.constant([[7.0] * 3, [9.0] * 3]))
    assert "InplaceUpdate" in types


def test_distinct_zeros_are_zero_and_never_merged():
    """Two buffers of one shape stay two tensors after Grappler's common-subexpression
    elimination (the chunked cache writes into each in place)."""
    @tf.function(autograph=False)
    def two(shape):
        a = kernels.distinct_zeros(shape, tf.float32)
        b = kernels.distinct_zeros(shape, tf.float32)
        a = kernels.write_rows_in_place(a, tf.constant([0]), tf.ones([1, 2]))
        return a, b

    a, b = two(tf.constant([2, 2]))
    np.testing.assert_array_equal(a, [[1, 1], [0, 0]])
    np.testing.assert_array_equal(b, [[0, 0], [0, 0]])


def test_training_runs_a_bfloat16_2d_product_on_a_cpu_as_batch_matmul():
    """A 2-D bfloat16 product on a CPU is BatchMatMulV2 (oneDNN's matmul, which uses the
    CPU's AMX tiles; the MatMul Grappler fuses with its bias does not), with tf.matmul's
    values; a float32 product and a GPU's stay MatMul."""
    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(6, 8)), tf.bfloat16)
    y = tf.constant(rng.normal(size=(8, 5)), tf.bfloat16)
    assert _op_types(kernels.matrix_unit_matmul, x, y) & {"MatMul", "BatchMatMulV2"} == {"BatchMatMulV2"}
    for adj_y, w in ((False, y), (True, tf.transpose(y))):
        np.testing.assert_allclose(tf.cast(kernels.matrix_unit_matmul(x, w, adj_y), tf.float32),
                                   tf.cast(tf.matmul(x, y), tf.float32), rtol=1e-2, atol=1e-2)
    assert "MatMul" in _op_types(kernels.matrix_unit_matmul, tf.cast(x, tf.float32), tf.cast(y, tf.float32))

    def on_gpu(a, b):
        with tf.device("/device:GPU:0"):  # traced only: the graph records the device
            return kernels.matrix_unit_matmul(tf.identity(a), b)

    assert "MatMul" in _op_types(on_gpu, x, y)


def test_a_bfloat16_training_pass_has_no_fused_matmul_projections():
    """Under mixed_bfloat16 every projection of the training pass is BatchMatMulV2, so
    Grappler has no MatMul to fuse into oneDNN's non-AMX inner product; its gradients
    stay MatMul."""
    model = build_model(TINY, dtype="mixed_bfloat16")
    source, target = random_batch()

    def loss(s, t):
        with tf.GradientTape() as tape:
            logits = model({"source": s, "target_in": t}, training=True)
            value = tf.reduce_sum(tf.cast(logits, tf.float32))
        return tape.gradient(value, model.trainable_variables)

    forward = _op_types(lambda s, t: model({"source": s, "target_in": t}, training=True), source, target)
    assert "BatchMatMulV2" in forward and "MatMul" not in forward
    assert "MatMul" in _op_types(loss, source, target)


def test_a_bfloat16_translator_keeps_tf_matmul_outside_training():
    """Only training takes BatchMatMulV2 for its 2-D bfloat16 products: a bfloat16
    Translator's encoder and step keep MatMul (fused with the bias by Grappler)."""
    inference = kernels.for_inference(tf.bfloat16)
    x = tf.constant(np.ones((6, 8)), tf.bfloat16)
    y = tf.constant(np.ones((8, 5)), tf.bfloat16)
    for policy in (inference.encoding, inference.step):
        assert "MatMul" in _op_types(policy.projection, x, y)
