"""Inputs: how a file (or tensors, or records) becomes validated sequences.

* formats: :mod:`.readers` (JSONL, in-memory records), :mod:`.npz`, :mod:`.parquet`,
  :mod:`.torchfile` (``.pt``), :mod:`.openai` (OpenAI-compatible responses),
  :mod:`.tensors` (``from_tensors``); :mod:`.writers` writes the audit's own columns;
* layouts: :mod:`.layout` (canonical columns, presets, ``--columns``, padding) over
  :mod:`.table` (the column containers every reader yields);
* rules: :mod:`.values` (one rule per value, every format), :mod:`.validate` (the
  per-sequence checks and exclusions), :mod:`.rows` (per-sequence tables);
* :mod:`.frameworks`: the RL frameworks' own metrics and their knobs.
"""
