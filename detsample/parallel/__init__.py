"""Tensor parallelism on ``torch.distributed`` whose bits are TP=1's (docs/tensor-parallel.md).

* :mod:`.layout`: the Megatron layout of a Llama / Qwen2 / Mistral / Qwen3-MoE / Mixtral /
  DeepSeek-V3 model (padded vocabulary) and what is refused; :mod:`.blocks`: one layer's
  attention (GQA, MLA) and MLP (dense, MoE) cut; :mod:`.experts`: experts placed on ranks;
* :mod:`.layers`: the column-, row- and vocab-parallel layers (the row-parallel combine is
  exact under ``batch_invariant(portable=True)``: :mod:`detsample.invariant.sharded`);
* :mod:`.comm`: one group's collectives; :mod:`.group`: local rank processes, bounded;
* :mod:`.runner`: a model spec loaded and sharded in every rank;
* :mod:`.sampling`: the sampler on vocab-sharded logits.

Importing this package starts nothing and imports no ``torch.distributed`` backend.
"""

from detsample.parallel.comm import Comm
from detsample.parallel.group import RankError, RankGroup, launch
from detsample.parallel.layers import RowParallelLinear, TensorParallelError, VocabParallelEmbedding, VocabParallelHead
from detsample.parallel.layout import ARCHITECTURES, Layout, plan, shard_model
from detsample.parallel.runner import TPModelSpec, check_spec, load_sharded, tp_group

__all__ = [
    "ARCHITECTURES",
    "Comm",
    "Layout",
    "RankError",
    "RankGroup",
    "RowParallelLinear",
    "TPModelSpec",
    "TensorParallelError",
    "VocabParallelEmbedding",
    "VocabParallelHead",
    "check_spec",
    "launch",
    "load_sharded",
    "plan",
    "shard_model",
    "tp_group",
]
