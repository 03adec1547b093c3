"""The embedded corpus and the binaries that prepare corpora and vocabularies."""
