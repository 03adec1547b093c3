"""Device-aware defaults, each decided in one place, proven here by their CPU twins:
oneDNN only without a GPU (process_defaults.py), one search per batch on a GPU
(translator.searches_per_batch), the trainer's target gather only on CPU
(trainer.step_policy_for), and a decoding-cache write with a kernel for the device
and every dtype the trainer uses (kernels.write_rows_in_place): a mixed_bfloat16
model's search traced for a GPU holds no bfloat16 op without a GPU kernel."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import process_defaults
from tf_transformer.config import DecodeConfig, ModelConfig
from tf_transformer.decoding.translator import Translator, searches_per_batch
from tf_transformer.model import build_model, kernels
from tf_transformer.training.trainer import step_policy_for

TRAINING_DTYPES = (tf.float32, tf.bfloat16, tf.float16)  # float32 and the two mixed policies


def test_onednn_is_a_default_only_without_a_gpu(tmp_path):
    gpu_machine, cpu_machine = tmp_path / "gpu_dev", tmp_path / "cpu_dev"
    gpu_machine.mkdir()
    cpu_machine.mkdir()
    (gpu_machine / "nvidia0").touch()
    (gpu_machine / "nvidiactl").touch()
    (cpu_machine / "null").touch()
    assert process_defaults.gpu_visible({}, str(gpu_machine))
    assert not process_defaults.gpu_visible({}, str(cpu_machine))
    assert not process_defaults.gpu_visible({"CUDA_VISIBLE_DEVICES": "-1"}, str(gpu_machine))
    assert not process_defaults.gpu_visible({"CUDA_VISIBLE_DEVICES": ""}, str(gpu_machine))
    environ = {}
    assert process_defaults.apply(environ, gpu=True) == {} == environ
    assert process_defaults.apply(environ, gpu=False) == {"TF_ENABLE_ONEDNN_OPTS": "1"}


def test_one_search_per_batch_on_a_gpu():
    decode = DecodeConfig(parallel_searches=2)
    assert searches_per_batch(decode, "GPU") == 1
    assert searches_per_batch(decode, "CPU") == 2


def test_the_target_gather_only_on_cpu_without_xla():
    assert step_policy_for("CPU", compiled=False).gather_targets
    assert not step_policy_for("CPU", compiled=True).gather_targets
    assert not step_policy_for("GPU", compiled=False).gather_targets


@pytest.mark.parametrize("device", ["CPU", "GPU"])
@pytest.mark.parametrize("dtype", TRAINING_DTYPES, ids=lambda d: d.name)
def test_the_cache_write_has_a_kernel_for_every_training_dtype(device, dtype):
    """Traced for `device`, the write's op is registered there for the dtype (on this
    CPU the GPU graph runs by soft placement) and writes what a scatter writes."""
    matrix = tf.constant(np.arange(24).reshape(6, 4), dtype)
    rows, values = tf.constant([1, 4]), tf.constant(-np.ones([2, 4]), dtype)

    @tf.function(autograph=False)
    def write(matrix):
        with tf.device(f"/{device}:0"):
            return kernels.write_rows_in_place(tf.identity(matrix), rows, values)

    graph = write.get_concrete_function(tf.TensorSpec([6, 4], dtype)).graph
    ops = [op for op in graph.get_operations()
           if op.type in ("InplaceUpdate", "TensorScatterUpdate")]
    assert len(ops) == 1 and kernels.has_kernel(ops[0].type, device, dtype), ops
    want = tf.tensor_scatter_nd_update(matrix, rows[:, None], values)
    np.testing.assert_array_equal(write(matrix).numpy(), want.numpy())


def test_a_write_without_an_in_place_kernel_is_a_scatter():
    """int16 has no GPU InplaceUpdate in TensorFlow 2.21: the GPU graph scatters."""
    assert not kernels.has_kernel("InplaceUpdate", "GPU", tf.int16)
    assert kernels.has_kernel("InplaceUpdate", "CPU", tf.int16)

    @tf.function(autograph=False)
    def write(matrix):
        with tf.device("/GPU:0"):
            return kernels.write_rows_in_place(tf.identity(matrix), tf.constant([0]),
                                               tf.constant([[7, 7]], tf.int16))

    graph = write.get_concrete_function(tf.TensorSpec([2, 2], tf.int16)).graph
    assert {op.type for op in graph.get_operations()} & {"TensorScatterUpdate", "InplaceUpdate"} \
        == {"TensorScatterUpdate"}
    np.testing.assert_array_equal(write(tf.zeros([2, 2], tf.int16)).numpy(), [[7, 7], [0, 0]])


def _nodes(graph_def):
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


# Functional control flow is lowered to Switch/Merge/Enter/... before it runs (no kernel of
# its own); the bodies' ops are checked in the graph's function library.
FUNCTIONAL = {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
              "PartitionedCall", "StatefulPartitionedCall"}


def _without_gpu_kernel(node, dtype) -> bool:
    """Whether `node` has a `dtype` type attribute and no GPU kernel registered for it."""
    if node.op in FUNCTIONAL:
        return False
    typed = {name for name, value in node.attr.items()
             if value.type == dtype.as_datatype_enum
             or dtype.as_datatype_enum in value.list.type}
    if not typed:
        return False
    for kernel in kernels.registered_kernels(node.op):
        if kernel.device_type == "GPU" and all(
                node.attr[c.name].type in c.allowed_values.list.type
                for c in kernel.constraint if c.name in typed and c.allowed_values.list.type):
            return False
    return True


def test_a_mixed_bfloat16_models_search_traced_for_a_gpu_has_gpu_kernels(small_tokenizer):
    """The trainer's dev BLEU decodes its live model; under mixed_bfloat16 every op of
    the search that computes in bfloat16 (the cache's in-place write included) has a
    GPU kernel for it, so none is sent to the host; and the GPU-traced search, run here
    by soft placement, translates as the CPU one does."""
    config = ModelConfig(vocab_size=small_tokenizer.vocab_size, num_layers=1, d_model=16,
                         d_ff=32, num_heads=2, dropout=0.0)
    model = build_model(config, dtype="mixed_bfloat16")
    decode = DecodeConfig(beam_size=2, extra_length=3, parallel_searches=1)
    outputs = {}
    for device in ("CPU", "GPU"):
        translator = Translator(model, small_tokenizer, decode, 32, device_type=device)

        @tf.function(autograph=False)
        def search(source_ids):
            with tf.device(f"/{device}:0"):
                return translator.translate_ids(source_ids)

        concrete = search.get_concrete_function(tf.TensorSpec([None, None], tf.int32))
        graph_def = concrete.graph.as_graph_def()
        written = [n for n in _nodes(graph_def) if n.op == "InplaceUpdate"
                   and n.attr["T"].type == tf.bfloat16.as_datatype_enum]
        assert written, "the bfloat16 cache is written in place"
        missing = sorted({n.op for n in _nodes(graph_def) if _without_gpu_kernel(n, tf.bfloat16)})
        if device == "GPU":
            assert not missing, missing
        ids = translator.source_ids(tf.constant(["Fonts", "Select the text to format."]))
        outputs[device] = {k: v.numpy() for k, v in search(ids).items()}
    for key in outputs["CPU"]:
        np.testing.assert_array_equal(outputs["GPU"][key], outputs["CPU"][key], err_msg=key)
