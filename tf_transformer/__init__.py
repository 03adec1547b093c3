"""tf_transformer: the Transformer of Vaswani et al. (2017) in TensorFlow/Keras.

Importing the package changes nothing in the process: the binaries set their
process defaults themselves (process_defaults.py).
"""
