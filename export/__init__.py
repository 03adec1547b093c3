"""The export binary (`python -m export`) and TF Serving material (export/serving/, SERVING.md).

The library code is tf_transformer/export_lib.py.
"""
