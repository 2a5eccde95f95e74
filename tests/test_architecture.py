"""The package's layering (docs/architecture.md): no import cycles, no upward imports.

Pins: a module that imports a higher layer (the sampler core reaching into the golden
harness, say) or two modules that import each other, even lazily inside a function or
only for type checking. Both make the tree lie about the architecture.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "detsample"

# Lowest first. A unit may import its own unit and any unit of a LOWER tier; units of one
# tier are peers and never import each other. Keep in step with docs/architecture.md.
# A dotted unit ("probe.threads") is a leaf module ranked on its own: the thread-count
# switch lives beside the probes' thread-count harness but imports only torch (and
# probe/__init__ imports nothing), so every tier may use it.
TIERS: list[tuple[str, ...]] = [
    ("arith",),
    ("errors", "version", "rules", "probe.threads"),
    ("params", "inputs", "outputs"),
    ("rng",),
    ("ops", "kernels"),
    ("processors", "grammar", "invariant"),
    ("vocab",),
    ("sampling",),
    ("batch",),
    ("sampler",),
    ("refmodel",),
    ("models",),
    ("parallel",),
    ("golden", "audit", "probe", "benchmarks"),
    ("checks",),
    ("testing",),
    ("cli",),
    ("__init__", "__main__"),
]
RANK = {unit: i for i, tier in enumerate(TIERS) for unit in tier}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def unit(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1:
        return "__init__"
    dotted = ".".join(parts[1:3])
    return dotted if dotted in RANK else parts[1]


def resolve(name: str) -> str | None:
    """The detsample module an import name refers to (a submodule, else its package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(mod: str) -> set[str]:
    """Every detsample module ``mod`` imports: top level, lazy and TYPE_CHECKING alike."""
    tree = ast.parse(MODULES[mod].read_text())
    is_pkg = MODULES[mod].name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for n in names:
            if n == "detsample" or n.startswith("detsample."):
                target = resolve(n)
                if target and target != mod:
                    out.add(target)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


#: at most this many modules at the top of detsample/ (the core a user imports; the
#: rest lives in subpackages)
TOP_MODULES = 10


def test_the_top_of_the_package_is_the_core():
    """Pins the layout of docs/architecture.md: a helper module added at the top of the
    package instead of inside the subpackage it serves."""
    top = sorted(p.stem for p in PKG.glob("*.py"))
    assert len(top) <= TOP_MODULES, f"{len(top)} top-level modules: {top}"


def test_every_unit_has_a_tier():
    missing = sorted({unit(m) for m in MODULES} - set(RANK))
    assert not missing, f"add these to TIERS and docs/architecture.md: {missing}"


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_no_upward_or_sideways_import(mod):
    src = unit(mod)
    bad = sorted(t for t in GRAPH[mod] if unit(t) != src and RANK[unit(t)] >= RANK[src])
    assert not bad, f"{mod} (tier {RANK[src]}) imports {bad}"


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            # a package importing its own submodules (re-exports) is not a cycle unless
            # a submodule imports the package back
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


#: the most positional parameters a function of the sampler or of ops/ takes (more go in
#: a frozen params object or behind ``*``)
MAX_POSITIONAL = 6


#: the sampler's modules: the pipeline, its pure ops and its internals
SAMPLER_PATHS = [PKG / "sampler.py", *sorted((PKG / "ops").glob("*.py")), *sorted((PKG / "sampling").glob("*.py"))]
#: the longest function of the sampler's modules, in lines (docstring included)
MAX_FUNCTION_LINES = 60


def test_sampler_and_ops_functions_take_few_positional_parameters():
    """Pins a helper grown to ten positional arguments (a call site that swaps two of
    them still runs)."""
    wide = []
    for path in SAMPLER_PATHS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                pos = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
                if len(pos) > MAX_POSITIONAL:
                    wide.append(f"{path.name}:{node.name} ({len(pos)})")
    assert not wide, wide


def test_sampler_functions_are_short():
    """Pins a step grown into one long function that mixes dispatch, early exits and
    index bookkeeping (step 8 once took 79 lines in one method)."""
    long = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1})"
        for path in SAMPLER_PATHS
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


#: where a step-8 filter need not appear: the harness around the sampler
FILTER_HARNESS = ("audit", "benchmarks", "cli", "golden", "processors", "checks", "parallel")


def test_the_files_a_new_threshold_filter_touches_are_listed():
    """docs/architecture.md lists the files a fourth (element-wise) threshold filter
    touches as the files of the package where min-p's name appears (its harness left
    out), and they are at most 5 with the oracle and the docs: the batch, the plan, the
    strategies, the kept mask, the sampler and the Triton kernel read the registry
    (``rules.ELEMENT_FILTERS``) and never name a filter. Pins a strategy that starts
    reading ``min_p`` by name again (a new filter would be skipped there), and the list
    drifting from the code either way."""
    import re

    doc = (PKG.parent / "docs" / "architecture.md").read_text()
    section = doc[doc.index("A fourth threshold filter") : doc.index("## Token paths")]
    listed = set(re.findall(r"`(detsample/[\w/]+\.py)`", section))
    word = re.compile(r"\bmin_ps?\b")
    found = {
        str(p.relative_to(PKG.parent))
        for p in PKG.rglob("*.py")
        if p.relative_to(PKG).parts[0] not in FILTER_HARNESS and word.search(p.read_text())
    }
    assert listed == found, (sorted(listed - found), sorted(found - listed))
    touched = re.findall(r"^\d+\. ", section, re.M)  # the numbered list: package, oracle, docs
    assert "`oracles/sampler.py`" in section and len(found) + 2 == len(touched) <= 5, found


#: detsample.audit's own tiers, lowest first: the leaf modules (the exclusion and error
#: types, the logprob semantics a row states) that every tier may use, then inputs (a
#: file becomes checked columns) < analysis (the exact accumulators, metrics, diagnosis)
#: < running (the driver, validation with rescoring, options, gates) < reports (the
#: summary, the page, provenance, the training-run log). docs/architecture.md and
#: detsample/audit/__init__.py say the same.
AUDIT_TIERS: list[tuple[str, ...]] = [
    ("issues", "semantics"),
    ("inputs",),
    ("analysis",),
    ("running",),
    ("reports",),
]
AUDIT_RANK = {u: i for i, tier in enumerate(AUDIT_TIERS) for u in tier}


def audit_unit(mod: str) -> str | None:
    """The audit tier unit of a module of detsample.audit (None: the facade itself)."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "audit" else None


AUDIT_MODULES = sorted(m for m in MODULES if m.startswith("detsample.audit."))


def test_every_audit_module_has_a_tier():
    missing = sorted({audit_unit(m) for m in AUDIT_MODULES} - set(AUDIT_RANK))
    assert not missing, f"add these to AUDIT_TIERS and docs/architecture.md: {missing}"


@pytest.mark.parametrize("mod", AUDIT_MODULES)
def test_audit_tiers_import_only_downward(mod):
    """Pins the bug that audit/'s four subpackages were names, not tiers (10 of the 12
    import directions between them existed: inputs importing running, reports, ...)."""
    src = audit_unit(mod)
    bad = sorted(
        t
        for t in GRAPH[mod]
        if t == "detsample.audit" or (audit_unit(t) not in (None, src) and AUDIT_RANK[audit_unit(t)] >= AUDIT_RANK[src])
    )
    assert not bad, f"{mod} (audit tier {AUDIT_RANK[src]}) imports {bad}"
