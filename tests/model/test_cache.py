"""The decoding cache (model/cache.py): both kinds give the full pass's logits,
eagerly, inside tf.while_loop and under XLA; the beam-facing protocol.

The tests only read their model (random weights, never trained): one model per set of
ModelConfig overrides serves the whole module (`tiny`), and its full pass over a target
is computed once (`full`)."""

import functools

import numpy as np
import pytest
import tensorflow as tf
from layer_fixtures import TINY, random_batch

from tf_transformer.model import build_model, cache, masks
from tf_transformer.model.cache import DecoderCache, FixedCache, GrowingCache

KINDS = {"growing": lambda length: cache.growing(), "chunked": lambda length: cache.chunked(),
         "fixed": cache.fixed}
# Eager steps of test_cached_decoding_equals_full_pass (and of the compiled loops): several
# writes and reads of the cache; each eager step of the 24 cases costs ~60 ms of CPU.
STEPS = 5


@pytest.fixture(scope="module")
def tiny():
    """overrides -> TINY with those ModelConfig fields changed, built once per module."""
    models = {}

    def model(**overrides):
        key = tuple(sorted(overrides.items()))
        if key not in models:
            models[key] = build_model(TINY.__class__(**{**TINY.__dict__, **overrides}))
        return models[key]

    return model


@functools.lru_cache(maxsize=None)
def _batch(t=8):
    """random_batch(t=t), the same tensors at each call."""
    return random_batch(t=t)


@pytest.fixture(scope="module")
def full():
    """(model, t) -> the teacher-forced logits over _batch(t), computed once per model."""
    passes = {}

    def logits(model, t=8):
        if (id(model), t) not in passes:
            source, target = _batch(t)
            passes[id(model), t] = model({"source": source, "target_in": target}).numpy()
        return passes[id(model), t]

    return logits


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("overrides", [
    {}, {"pre_norm": True}, {"positions": "learned"}, {"d_k": 8, "d_v": 12},
    {"transpose_output": False}, {"table_positions": 9},
    {"table_positions": 9, "positions": "learned"}, {"memory_multiple": 16}])
def test_cached_decoding_equals_full_pass(overrides, kind, tiny, full):
    """Also with the output table read through transpose_b (XLA's search) instead of
    transposed once per search, with the position vectors made once per search
    (`table_positions`, graph mode) instead of at each step, and with the memory padded
    and masked to 16 positions (a bfloat16 step's `memory_multiple`)."""
    overrides = dict(overrides)
    transpose_output = overrides.pop("transpose_output", True)
    table_positions = overrides.pop("table_positions", 0)
    memory_multiple = overrides.pop("memory_multiple", 1)
    model = tiny(**overrides)
    source, target = _batch(STEPS)
    state = model.initial_cache(model.encode(source), source, KINDS[kind](STEPS),
                                transpose_output,
                                positions=tf.constant(table_positions) if table_positions else 0,
                                memory_multiple=memory_multiple)
    assert (state.output_table.shape == (32, 40)) if transpose_output else state.output_table == ()
    if table_positions:
        assert state.position_table.shape == (9, 32)
    width = 16 if memory_multiple == 16 else 7  # the source's 7 positions, padded
    assert state.memory_keys[0].shape[2] == state.memory_bias.shape[-1] == width
    steps = []
    for step in range(STEPS):
        logits, state = model.decode_step(target, tf.constant(step), state)
        steps.append(logits.numpy())
    # grown to, or fixed at, STEPS positions; a chunked cache to its first chunk
    assert state.self_attention[0].keys.shape[2] == (16 if kind == "chunked" else STEPS)
    np.testing.assert_allclose(np.stack(steps, 1), full(model, STEPS), atol=1e-5)


def test_a_chunked_cache_grows_by_chunks(monkeypatch, tiny, full):
    """Over several chunks (3 positions each here): written in place, the unwritten
    columns masked, every step equal to the full pass."""
    monkeypatch.setattr(cache.ChunkedCache, "CHUNK", 3)
    model = tiny()
    source, target = _batch()
    state = model.initial_cache(model.encode(source), source, cache.chunked())
    steps, lengths = [], []
    for step in range(8):
        logits, state = model.decode_step(target, tf.constant(step), state)
        steps.append(logits.numpy())
        lengths.append(int(state.self_attention[0].keys.shape[2]))
    assert lengths == [3, 3, 3, 6, 6, 6, 9, 9]
    np.testing.assert_allclose(np.stack(steps, 1), full(model), atol=1e-5)


def _loop_decoder(model, kind, jit):
    """A tf.function decoding every position of `target` in a tf.while_loop
    (fixed cache) or, for a growing cache under XLA, a Python loop (XLA loops
    need loop-invariant shapes; the graph's while_loop does not)."""
    def run(source, target):
        length = target.shape[1]
        state = model.initial_cache(model.encode(source), source, KINDS[kind](length))
        if kind == "growing" and jit:
            steps = []
            for step in range(length):
                logits, state = model.decode_step(target, tf.constant(step), state)
                steps.append(logits)
            return tf.stack(steps, 1)

        def body(step, state, out):
            logits, state = model.decode_step(target, step, state)
            return step + 1, state, out.write(step, logits)

        invariants = tf.nest.map_structure(lambda t: tf.TensorShape([None] * t.shape.rank), state)
        _, _, out = tf.while_loop(
            lambda step, *_: step < length, body,
            (tf.constant(0), state, tf.TensorArray(tf.float32, size=length)),
            shape_invariants=(tf.TensorShape([]), invariants, tf.TensorShape(None)))
        return tf.transpose(out.stack(), [1, 0, 2])
    return tf.function(run, autograph=False, jit_compile=jit)


@pytest.mark.parametrize("kind,jit", [
    ("growing", False), ("growing", True), ("chunked", False), ("fixed", False), ("fixed", True)],
    ids=["growing-while_loop", "growing-jit_compile", "chunked-while_loop",
         "fixed-while_loop", "fixed-jit_compile"])  # chunks change shape: graph mode only
def test_cache_equals_full_pass_compiled(kind, jit, tiny, full):
    """5 steps: a loop of several steps (XLA unrolls the growing cache's) is the point.
    One layer each side: what the loop and XLA do to the cache is the same in every
    layer (the eager steps above check the layers' caches kept apart), and each layer
    is traced and compiled again in each of the 5 unrolled steps."""
    model = tiny(num_layers=1)
    decode = _loop_decoder(model, kind, jit)
    np.testing.assert_allclose(decode(*_batch(STEPS)).numpy(), full(model, STEPS), atol=1e-5)


def test_short_fixed_cache_padded_midway_equals_full_pass(tiny, full):
    """XLA's staging (decoding/compiled_search.py): 3 steps on 3 positions, then 8."""
    model = tiny()
    source, target = _batch()
    state = model.initial_cache(model.encode(source), source, cache.fixed(3))
    steps = []
    for step in range(8):
        if step == 3:
            state = state.padded(8)
        logits, state = model.decode_step(target, tf.constant(step), state)
        steps.append(logits.numpy())
    np.testing.assert_allclose(np.stack(steps, 1), full(model), atol=1e-5)


def test_both_kinds_write_the_same_positions():
    k = tf.reshape(tf.range(2 * 3 * 4, dtype=tf.float32), [2, 3, 1, 4])
    growing = GrowingCache(tf.zeros([2, 3, 0, 4]), tf.zeros([2, 3, 0, 4]))
    fixed = FixedCache(tf.zeros([2, 3, 5, 4]), tf.zeros([2, 3, 5, 4]))
    for step in range(2):
        growing = growing.write(k + step, -k - step, step)
        fixed = fixed.write(k + step, -k - step, step)
    assert growing.keys.shape == (2, 3, 2, 4)
    np.testing.assert_array_equal(fixed.keys[:, :, :2], growing.keys)
    np.testing.assert_array_equal(fixed.values[:, :, :2], growing.values)
    assert not fixed.keys[:, :, 2:].numpy().any()
    assert growing.bias(1) == 0.0
    np.testing.assert_array_equal(fixed.bias(1).numpy()[0, 0, 0] == 0.0,
                                  [True, True, False, False, False])
    assert fixed.padded(7).keys.shape == (2, 3, 7, 4)


def test_beams_share_memory_and_reorder_self_attention(tiny):
    model = tiny()
    source, target = _batch()
    state = model.initial_cache(model.encode(source), source, cache.fixed(8))
    _, state = model.decode_step(target, tf.constant(0), state)
    tiled = state.tile(3)
    assert isinstance(tiled, DecoderCache)
    for before, after in zip(tf.nest.flatten(state.self_attention),
                             tf.nest.flatten(tiled.self_attention)):
        np.testing.assert_array_equal(after.numpy(), np.repeat(before.numpy(), 3, axis=0))
    # The memory keeps one row per sentence: never tiled.
    assert tiled.memory_keys[0] is state.memory_keys[0]
    assert tiled.memory_bias is state.memory_bias
    rows = tf.constant([5, 5, 4, 0, 1, 2])
    reordered = tiled.reorder(rows)
    for before, after in zip(tf.nest.flatten(tiled.self_attention),
                             tf.nest.flatten(reordered.self_attention)):
        np.testing.assert_array_equal(after.numpy(), before.numpy()[rows.numpy()])
    # What every beam shares is left as it is, not gathered.
    assert reordered.memory_keys[0] is tiled.memory_keys[0]
    assert reordered.memory_bias is tiled.memory_bias


def test_compact_gathers_every_part_and_may_drop_rows(tiny):
    """Finished sentences leave the batch (decoding/live_rows.py): memory follows too."""
    model = tiny()
    source, target = _batch()
    state = model.initial_cache(model.encode(source), source, cache.growing())
    _, state = model.decode_step(target, tf.constant(0), state)
    tiled = state.tile(2)
    rows = tf.constant([3, 2])  # the second sentence's beams, swapped; the first dropped
    compacted = tiled.compact(rows)
    for before, after in zip(tf.nest.flatten(tiled.self_attention),
                             tf.nest.flatten(compacted.self_attention)):
        np.testing.assert_array_equal(after.numpy(), before.numpy()[rows.numpy()])
    shared = (tiled.memory_keys, tiled.memory_values, tiled.memory_bias)
    kept = (compacted.memory_keys, compacted.memory_values, compacted.memory_bias)
    for before, after in zip(tf.nest.flatten(shared), tf.nest.flatten(kept)):
        np.testing.assert_array_equal(after.numpy(), before.numpy()[[1]])


def test_a_beam_folded_into_the_query_axis_attends_like_tiled_memory(tiny):
    """CrossAttention.step with one memory row per sentence and `group` query rows per
    sentence gives what the same queries give against a memory tiled to every row."""
    model = tiny()
    source, _ = _batch()
    layer = model.decoder.layers[0].cross_attention
    keys, values = layer.project_memory(model.encode(source))
    bias = masks.attention_bias(masks.padding_mask(source))
    group = 3
    x = tf.random.stateless_normal([source.shape[0] * group, 1, TINY.d_model], seed=[1, 2])
    folded = layer.step(x, keys, values, bias)
    tiled = layer.step(x, *(tf.repeat(t, group, axis=0) for t in (keys, values, bias)))
    assert folded.shape == tiled.shape == x.shape
    np.testing.assert_allclose(folded.numpy(), tiled.numpy(), rtol=1e-5, atol=1e-5)
