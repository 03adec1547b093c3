"""tf_transformer: the Transformer of Vaswani et al. (2017) in TensorFlow/Keras.

Importing the package turns on TensorFlow's oneDNN kernels unless the user
chose otherwise: the stock TensorFlow wheel enables them only on CPUs with
AVX-512 VNNI/BF16, and its Eigen kernels are built without FMA, so on an
AVX2/FMA CPU oneDNN doubles matmul throughput (BUILD.md, "CPU kernels").
It must happen before TensorFlow is imported.
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
