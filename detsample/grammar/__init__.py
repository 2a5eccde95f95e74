"""Grammar-constrained sampling on xgrammar (pipeline step 4).

* :class:`GrammarConfig` -- frozen options (JSON whitespace, compile timeout, pool size,
  mask cache policy, cache budget).
* :class:`GrammarCompiler` -- a compile cache keyed by (kind, text, vocabulary
  fingerprint) and a thread pool: compilation never runs on the sampling path.
* :class:`RequestGrammar` -- one request's matcher: fill its bitmask row, accept tokens,
  rollback, jump-forward; a compile failure or timeout is an error state of that request.
* :class:`GrammarMasker` -- fills the rows of a reused bitmask in parallel and applies it.
* :class:`~detsample.grammar.budget.CacheBudget` -- the one byte budget (LRU) of a
  compiler's compiled grammars, state names and cached rows (``GrammarConfig.cache_bytes``).

Nothing here is global: a compiler belongs to a :class:`~detsample.Vocabulary`
(``vocab.grammar_compiler``, lazily) or to whoever constructs one.
"""

from detsample.grammar.compiler import CompileStats, GrammarCompiler
from detsample.grammar.config import GRAMMAR_KINDS, GrammarConfig
from detsample.grammar.masker import GrammarMasker
from detsample.grammar.request import RequestGrammar

__all__ = ["CompileStats", "GRAMMAR_KINDS", "GrammarCompiler", "GrammarConfig", "GrammarMasker", "RequestGrammar"]
