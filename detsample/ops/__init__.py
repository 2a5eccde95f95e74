"""Pure tensor functions of the sampling pipeline (no state, no I/O)."""
