"""The model-independent beam search of section 6.1: the GNMT length penalty, a provable
early stop, fixed-shape state, finished sentences leaving the working batch."""
