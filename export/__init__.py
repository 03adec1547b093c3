"""The export binary (`python -m export`) and TF Serving material (export/serving/ and its README).

The library code is tf_transformer/exporters/ (saved_model.py, ctranslate2.py).
"""
