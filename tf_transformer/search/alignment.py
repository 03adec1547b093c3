"""Alignments: each hypothesis's attention over the source, kept by the beam search when asked.

`BeamSearch(..., alignment_width=S)` asks for them. The model's step then
returns a third value, its attention over the S source positions for each row,
float32 [rows, S] (model/transformer.py's decode_step(with_attention=True): the
last decoder layer's cross-attention averaged over heads, as OpenNMT and
Marian report), and the search keeps, beside each hypothesis's ids, its history
[rows, beam, width, S]: column c holds the attention of the step that chose the
token in ids column c (column 0, BOS, stays 0).

The history follows the ids: grown from the parent's (a beam reorder's gather),
merged into the finished hypotheses by the same top-k index, and gathered with
the working rows when finished sentences leave (live_rows.py's ROW_FIELDS), so
no cache holds it. Without alignments the state's attention fields are () and
the step runs exactly the ops it runs without this module.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tf_transformer.search.state import BeamState, SearchConfig


def empty_history(batch, beam: int, width, alignment_width) -> tf.Tensor:
    """float32 zeros [batch, beam, width, S]."""
    return tf.zeros(tf.stack([batch, beam, width, alignment_width]), tf.float32)


def grow_alive(grow: Callable, config: SearchConfig, state: BeamState, first: bool):
    """`grow` (beam_step's grow-alive stage) over a model whose step also returns its
    attention; returns grow's (log_probs, ids, parents, tokens, cache) and the grown
    history [rows, beam, width, S]: the parents' histories with column step + 1
    set to the attention of the step that chose the new token."""
    captured = []

    def symbols_to_logits_fn(ids, step, cache):
        logits, cache, attention = config.symbols_to_logits_fn(ids, step, cache)
        captured.append(attention)
        return logits, cache

    grown = grow(config._replace(symbols_to_logits_fn=symbols_to_logits_fn), state, first)
    parents = grown[2]
    history = state.alive_attention
    beam, width = config.beam_size, tf.shape(history)[2]
    # [rows, beam, S], or [rows, 1, S] on the first step (slot 0's row only)
    attention = tf.reshape(tf.cast(captured[0], tf.float32),
                           [-1, 1 if first else beam, history.shape[3] or tf.shape(history)[3]])
    if first:  # every extension's parent is slot 0; the other slots are empty
        attention = tf.repeat(attention, beam, axis=1)
    elif beam > 1:
        attention = tf.gather(attention, parents, batch_dims=1)
        history = tf.gather(history, parents, batch_dims=1)
    column = (tf.range(width) == state.step + 1)[:, tf.newaxis]  # [width, 1]
    return grown + (tf.where(column, attention[:, :, tf.newaxis], history),)


def merge_finished(finished: tf.Tensor, grown: tf.Tensor, index: tf.Tensor,
                   done: tf.Tensor) -> tf.Tensor:
    """The finished hypotheses' histories after the new-finished stage: `index`
    [rows, beam] picks from [finished, grown] (2 * beam slots) as it picked their
    ids; unchanged for sentences already `done` [rows]."""
    merged = tf.gather(tf.concat([finished, grown], axis=1), index, batch_dims=1)
    return tf.where(done[:, tf.newaxis, tf.newaxis, tf.newaxis], finished, merged)
