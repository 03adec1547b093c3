"""Beam search and the Translator: the one strings-to-strings path (section 6.1)."""
