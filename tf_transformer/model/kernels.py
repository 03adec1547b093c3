"""The one seam for kernel choices: which TensorFlow kernels the layers' products run on.

The layers compute what section 3 says; how TensorFlow executes a product is a
property of the hardware and of the graph's shapes, not of the model. A
`Kernels` policy names those choices, and the caller passes it down
explicitly (no module state):

  TRAINING  every product as tf.matmul: MatMul/BatchMatMulV2, which oneDNN
            rewrites into its own kernels on AVX-512 CPUs (and which runs
            cuBLAS on GPUs), but a 2-D bfloat16 product on a CPU as
            BatchMatMulV2 (`matrix_unit_matmul`). Training's shapes repeat,
            one per bucket.
  ENCODING  the Translator's encoder and memory projection: the projections
            through `eigen_matmul`, because each batch brings a new source
            width and oneDNN builds and keeps a kernel per shape (memory for
            the process's life, no faster); attention stays on tf.matmul
            (on Eigen it costs batch-1 latency).
  STEP      a decoding step's products (one position, shapes that change every
            step as the cache grows and sentences leave) on Eigen, and its
            softmax as exp(log_softmax) (LogSoftmax has no oneDNN kernel either).
  BFLOAT16_ENCODING  a bfloat16 Translator's encoder: every product as
            tf.matmul, the projections fused with their bias (TRAINING's
            BatchMatMulV2 decodes no faster there, and its oneDNN kernel per
            source width weighs more).
  BFLOAT16_STEP  a bfloat16 model's step: its products on oneDNN, the only
            kernels that run bfloat16 on the CPU's matrix units, over an
            encoder memory padded to a multiple of 16 positions.

`for_inference(dtype)` gives a Translator its encoding and step policies; an
int8 Translator's model is bfloat16 (BFLOAT16_ENCODING, BFLOAT16_STEP for what
is not quantized), its step's projections oneDNN's quantized matmul
(`quantized_matmul`, driven by model/quantized.py).

Under XLA every choice compiles to the same dot. The private TensorFlow ops
the decoding cache writes with, and the kernel registry that decides where the
in-place write may run (`has_kernel`), live here too, behind adapters that
tests/model/test_kernels.py holds to their contract.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.eager import context, execute
from tensorflow.python.framework import kernels as tf_kernels
from tensorflow.python.framework import op_def_registry
from tensorflow.python.ops import gen_array_ops

from tf_transformer.config import ConfigError

Product = Callable[..., tf.Tensor]  # (x, y, adj_y=False) -> x y or x y^T


def onednn_matmul(x: tf.Tensor, y: tf.Tensor, adj_y: bool = False) -> tf.Tensor:
    """x y (or x y^T) as tf.matmul: MatMul for 2-D, BatchMatMulV2 above (oneDNN's on CPU)."""
    return tf.matmul(x, y, transpose_b=adj_y)


def matrix_unit_matmul(x: tf.Tensor, y: tf.Tensor, adj_y: bool = False) -> tf.Tensor:
    """x y (or x y^T) as tf.matmul, except a 2-D bfloat16 product on a CPU: BatchMatMulV2.

    Grappler fuses a 2-D MatMul with its BiasAdd (and ReLU) into oneDNN's inner
    product, which gets weights that are not graph constants in their plain layout
    and runs them on its generic GEMM, never on the CPU's AMX tiles; BatchMatMulV2
    becomes oneDNN's matmul, which packs plain weights for AMX itself, and the bias
    is added by its own op. Other dtypes and GPUs keep MatMul; under XLA both
    compile to the same dot (BUILD.md, performance decisions)."""
    if x.dtype == tf.bfloat16 and x.shape.rank == 2 and device_type(x.device) == "CPU":
        return tf.raw_ops.BatchMatMulV2(x=x, y=y, adj_y=adj_y)
    return onednn_matmul(x, y, adj_y)


def eigen_matmul(x: tf.Tensor, y: tf.Tensor, adj_y: bool = False) -> tf.Tensor:
    """x y (or x y^T) as BatchMatMulV3: the same product with its output type
    explicit, which oneDNN's graph rewrite does not claim, so it runs Eigen's
    kernel (and compiles under XLA like the others)."""
    return tf.raw_ops.BatchMatMulV3(x=x, y=y, Tout=x.dtype, adj_y=adj_y)


def exp_log_softmax(logits: tf.Tensor) -> tf.Tensor:
    """softmax as exp(log_softmax): LogSoftmax has no oneDNN kernel."""
    return tf.exp(tf.nn.log_softmax(logits))


@dataclasses.dataclass(frozen=True)
class Kernels:
    """The kernels a pass's products and attention softmax run on.

    projection: the 2-D products x W of `linear` (projections, FFN, output layer).
    attention: Q K^T and weights V.
    softmax: the attention weights' softmax (float32 logits in, float32 out).
    memory_multiple: a decoding step's projected encoder memory is padded (masked)
      to a multiple of this many positions, so its cross-attention products take
      one shape per this many source widths (Transformer.initial_cache).
    """

    projection: Product = onednn_matmul
    attention: Product = onednn_matmul
    softmax: Callable[[tf.Tensor], tf.Tensor] = tf.nn.softmax
    memory_multiple: int = 1


TRAINING = Kernels(projection=matrix_unit_matmul)
ENCODING = Kernels(projection=eigen_matmul)
STEP = Kernels(projection=eigen_matmul, attention=eigen_matmul, softmax=exp_log_softmax)
# bfloat16 inference: Eigen's bfloat16 products run without the CPU's matrix units
# (BatchMatMulV3 in bfloat16 is several times slower than oneDNN's, which uses AMX),
# so every product goes to oneDNN, whatever its shape. oneDNN builds and keeps a
# kernel per shape: the memory is padded to 16 positions, so a new source width
# rarely brings a new cross-attention shape (float32 attends on Eigen: no padding).
BFLOAT16_ENCODING = Kernels()
BFLOAT16_STEP = Kernels(softmax=exp_log_softmax, memory_multiple=16)


@dataclasses.dataclass(frozen=True)
class InferenceKernels:
    """The policies of an inference graph: its encoder (with the memory's
    projections) and a decoding step."""

    encoding: Kernels
    step: Kernels


def for_inference(dtype) -> InferenceKernels:
    """The kernels a Translator's model of compute dtype `dtype` runs on ("int8": its
    bfloat16 model's, the quantized projections aside)."""
    if tf.as_dtype(dtype) in (tf.bfloat16, tf.int8):
        return InferenceKernels(encoding=BFLOAT16_ENCODING, step=BFLOAT16_STEP)
    return InferenceKernels(encoding=ENCODING, step=STEP)


# -- where a graph's ops run, and which kernels TensorFlow has there --------
def device_type(device: str = "") -> str:
    """"GPU" or "CPU": the type of `device` (a device string, "" for none), or for
    no device, where TensorFlow's default placement puts an op (a GPU if one is
    visible)."""
    named = tf.DeviceSpec.from_string(device or "").device_type
    if named:
        return named.upper()
    return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"


def has_kernel(op_type: str, device: str, dtype: tf.DType, attr: str = "T") -> bool:
    """Whether this TensorFlow build registers a kernel of `op_type` on `device`
    ("CPU", "GPU") for `dtype` as its type attribute `attr`."""
    dtype = tf.as_dtype(dtype).as_datatype_enum
    for kernel in registered_kernels(op_type):
        allowed = [c.allowed_values.list.type for c in kernel.constraint if c.name == attr]
        if kernel.device_type == device and all(dtype in types for types in allowed):
            return True
    return False


# -- adapters of TensorFlow ops outside its public API ------------------------
def registered_kernels(op_type: str) -> list:
    """The KernelDefs TensorFlow registered for `op_type` (device_type, constraint)."""
    return list(tf_kernels.get_registered_kernels_for_op(op_type).kernel)


def write_rows_in_place(matrix: tf.Tensor, rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """matrix [n, d] with rows `rows` int32 [m] set to values [m, d].

    Written into the input's own buffer (TensorFlow's InplaceUpdate, the op
    behind `alias_inplace_update`: no copy of the matrix) where TensorFlow has
    that kernel for the device the write runs on (`device_type` of the matrix)
    and its dtype; elsewhere a scatter, so an op without a kernel never sends
    the cache to the host and back. Safe only on a tensor no other op reads
    afterwards."""
    if has_kernel("InplaceUpdate", device_type(matrix.device), matrix.dtype):
        return gen_array_ops.inplace_update(matrix, rows, values)
    return tf.tensor_scatter_nd_update(matrix, rows[:, None], values)


def distinct_zeros(shape: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """A zero-filled tensor made by TensorFlow's stateful `Empty` op: Grappler
    never merges two of them, where two equal `tf.zeros` become one tensor
    (and so would every in-place write into them)."""
    return gen_array_ops.empty(shape, dtype, init=True)


# -- oneDNN's quantized matmul -------------------------------------------------
QUANTIZED_MATMUL = "_QuantizedMatMul"
_QUANTIZE = "QuantizeV2"


def require_quantized_matmul() -> None:
    """Raises ConfigError unless this TensorFlow build has oneDNN's quantized matmul
    (`_QuantizedMatMul` on the CPU for int8 activations and weights, float32 output)
    and QuantizeV2 for int8: builds without oneDNN register neither."""
    for op_type, attr in ((QUANTIZED_MATMUL, "T1"), (_QUANTIZE, "T")):
        if op_def_registry.get(op_type) is None or not has_kernel(op_type, "CPU", tf.qint8, attr):
            raise ConfigError(
                f"int8 decoding needs TensorFlow's {op_type} op with an int8 CPU kernel, which "
                f"this TensorFlow build ({tf.__version__}) does not register (it comes with "
                "oneDNN builds, the default x86 Linux wheel); decode in float32 or bfloat16")


def quantize_rows(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """float32 x [m, k] -> (qint8 [m, k], float32 [m, 1]): each row symmetric int8 over
    its own range r, round(127 x / r) (QuantizeV2, SCALED, narrow range -127..127, per
    row: axis 0), and r (at least 1e-12: a zero row stays zeros). Per row, a row's
    values do not depend on the other rows of its batch (nor its translation on its
    batch-mates). The ranges are ours, not QuantizeV2's outputs, which are a scalar
    for one row."""
    ranges = tf.maximum(tf.reduce_max(tf.abs(x), axis=1), 1e-12)
    # SCALED takes the range [min(min_range, 0), max_range] to max(|min|, |max|): with
    # min_range = max_range = r, [-r, r] (an op fewer than negating r).
    values = tf.raw_ops.QuantizeV2(
        input=x, min_range=ranges, max_range=ranges, T=tf.qint8, mode="SCALED",
        round_mode="HALF_TO_EVEN", narrow_range=True, axis=0, ensure_minimum_range=0.0)[0]
    return values, ranges[:, tf.newaxis]


def _attr_value(value) -> attr_value_pb2.AttrValue:
    """An op attribute as the graph stores it: a dtype, a list of dtypes or strings, a
    bool or a float."""
    if isinstance(value, tf.DType):
        return attr_value_pb2.AttrValue(type=value.as_datatype_enum)
    if isinstance(value, list):
        if value and isinstance(value[0], str):
            return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                s=[v.encode() for v in value]))
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            type=[v.as_datatype_enum for v in value]))
    if isinstance(value, bool):
        return attr_value_pb2.AttrValue(b=value)
    if isinstance(value, str):
        return attr_value_pb2.AttrValue(s=value.encode())
    return attr_value_pb2.AttrValue(f=value)


def quantized_matmul(x: tf.Tensor, weights: tf.Tensor, weights_min: tf.Tensor,
                     weights_max: tf.Tensor, bias: tf.Tensor, relu: bool = False,
                     weights_constant: bool = True) -> tf.Tensor:
    """relu?(x/127 dequantized(weights) + bias), float32 [m, n], as one oneDNN kernel:
    `_QuantizedMatMul` with fused BiasAdd(, Relu) and Dequantize.

    x: qint8 [m, k] on the scale 1/127 (rows of `quantize_rows`: its ranges multiply
    the output's rows afterwards); weights: int8 or qint8 [k, n], output channel j on
    the scale max(|weights_min[j]|, |weights_max[j]|) / 127 (float32 [n] each: oneDNN
    keys its kernels on their buffers, so pass the same tensors every call, not new
    ones); bias float32 [n]. The accumulation is int32 (on AMX tiles where the CPU has
    them), scaled in float32; exact for weights within +-63 on every CPU, within +-127
    only with VNNI or AMX (quantized.WEIGHT_LEVELS says why). `weights_constant`: the
    kernel keeps its reordered copy of the first weights (and bias) it sees, so a graph
    must give each op the same (constant) weights every call; an eager op's kernel is
    shared by every call, so eager callers pass False."""
    fused = ["BiasAdd", "Relu", "Dequantize"] if relu else ["BiasAdd", "Dequantize"]
    # int8 weights: a loop carries its captured constants, and loops have no qint8 kernels.
    weights = tf.bitcast(weights, tf.qint8) if weights.dtype == tf.int8 else weights
    unit = tf.constant(1.0)  # x's range: a constant, so one oneDNN kernel per shape
    inputs = [x, weights, bias, -unit, unit, weights_min, weights_max]
    attrs = dict(T1=tf.qint8, T2=tf.qint8, Tbias=tf.float32, Tout=tf.float32, U=tf.float32,
                 Tdevice_inputs=[t.dtype for t in inputs], Thost_inputs=[],
                 Tdevice_outputs=[tf.float32], Thost_outputs=[], fused_ops=fused,
                 transpose_a=False, transpose_b=False, is_weight_const=weights_constant,
                 is_bias_const=weights_constant, input_quant_mode="SCALED",
                 output_quant_mode="SCALED",
                 leakyrelu_alpha=0.2)
    if not tf.executing_eagerly():
        op = tf.compat.v1.get_default_graph().create_op(
            QUANTIZED_MATMUL, inputs, [tf.float32], name="QuantizedMatMul",
            attrs={k: _attr_value(v) for k, v in attrs.items()})
        return op.outputs[0]
    flat = []
    for name, value in attrs.items():
        if isinstance(value, tf.DType):
            value = value.as_datatype_enum
        elif isinstance(value, list) and name.startswith("T"):
            value = [t.as_datatype_enum for t in value]
        flat += [name, value]
    return execute.execute(QUANTIZED_MATMUL, 1, inputs=inputs, attrs=tuple(flat),
                           ctx=context.context())[0]
