"""What the binaries share for their input and output: line reading, sentences translated
in length-sorted batches (batching.py), chunked streaming translation with progress,
attention plots, and the quality and speed scores (evaluation.py) the train and evaluate
binaries report."""
