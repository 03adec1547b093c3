"""The one strings-to-strings translation service (the Translator), its compiled search and
its signatures."""
