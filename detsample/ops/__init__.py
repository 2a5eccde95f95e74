"""Pure tensor functions composed by the Sampler: no state, no I/O, no environment
sniffing. Each function states shapes, dtypes and its guarantee in its docstring."""
