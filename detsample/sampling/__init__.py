"""The sampler's internals: the per-composition routing of a batch's rows (``rowplan``)
and one Sampler's reusable scratch buffers (``workspace``). Importing this package
imports nothing; :mod:`detsample.sampler` composes these modules."""
