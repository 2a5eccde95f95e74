"""Exception types of detsample.

Every validation error names the offending field and value, e.g.
``InvalidSamplingParams("top_p must be in (0, 1], got 1.5")``.
"""

from __future__ import annotations


class DetsampleError(Exception):
    """Base class of every error raised by detsample."""


class InvalidSamplingParams(DetsampleError, ValueError):
    """A request, a batch or a sampler input is invalid (field and value named)."""


class GrammarError(DetsampleError, ValueError):
    """A grammar failed to compile, timed out, or rejected a token."""


class GoldenMismatch(DetsampleError, AssertionError):
    """Obtained outputs differ from the golden files (bits, not tolerances)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) as the ``detsample`` command raises it: a real interrupt, told
    apart from a ``KeyboardInterrupt`` that user code (a model factory) raises itself."""
