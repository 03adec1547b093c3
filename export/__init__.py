"""The export binary (`python -m export`) and TF Serving material (export/serving/; BUILD.md, "Export and serving").

The library code is tf_transformer/saved_model.py.
"""
