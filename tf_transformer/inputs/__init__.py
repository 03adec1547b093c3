"""Parallel corpora, the shared SentencePiece vocabulary and the bucketed tf.data pipeline."""
