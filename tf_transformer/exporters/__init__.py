"""Exports of a model directory: a TF Serving SavedModel and CTranslate2's format."""
