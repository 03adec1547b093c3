"""What the binaries share for their input and output: line reading, chunked streaming
translation with progress, attention plots."""
