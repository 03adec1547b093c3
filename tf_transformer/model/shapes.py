"""Reshape targets that cost as few ops as the static shape allows.

Why: `tf.shape(x)[i]` is three ops (Shape, StridedSlice, and a Pack or
ConcatV2 to build the target) that graph mode runs on every call, and in a
decoding step, where x is [rows, 1, d], every reshape of every layer paid
them for dimensions known when the graph was traced. `dims` returns Python
ints for static dimensions, and -1 for the one unknown dimension when every
other one is a static non-zero int (-1 cannot be inferred for an empty tensor
otherwise); only the rest are read at run time.
"""

from __future__ import annotations

import tensorflow as tf


def dims(x: tf.Tensor, count: int | None = None) -> list:
    """x's first `count` dimensions (all by default) as a reshape target's head."""
    if x.shape.rank is None:
        raise ValueError("shapes.dims needs a tensor of known rank")
    static = (x.shape[:count] if count is not None else x.shape).as_list()
    unknown = [i for i, d in enumerate(static) if d is None]
    if len(unknown) == 1 and all(d for d in static if d is not None):
        return [-1 if d is None else d for d in static]
    if not unknown:
        return static
    dynamic = tf.shape(x)
    return [dynamic[i] if d is None else d for i, d in enumerate(static)]
