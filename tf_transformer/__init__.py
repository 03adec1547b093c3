"""tf_transformer: the Transformer of Vaswani et al. (2017) in TensorFlow/Keras."""
