"""JSON Schemas checked and rewritten before xgrammar sees them.

xgrammar silently ignores some JSON-Schema keywords and mistranslates others; a request
constrained by such a schema could finish with output that fails validation.
:func:`prepare_json_schema` walks the schema and

* rejects, with a :class:`GrammarError` naming the keyword and its JSON pointer, every
  keyword the grammar cannot honour (``not``, ``if``, ``uniqueItems``, ``contains``,
  ``dependentRequired``, a number's ``multipleOf``, ``allOf`` with several members, a
  ``oneOf`` whose branches may overlap, keywords next to ``$ref`` / ``anyOf`` / ``enum``
  that xgrammar drops, a ``pattern`` combined with lengths, ...);
* replaces every supported ``format`` by the stricter pattern of
  :data:`detsample.grammar.formats.FORMAT_PATTERNS`, and every pattern (string patterns,
  ``patternProperties`` keys) by a placeholder regex whose rule the grammar correction
  (:mod:`detsample.grammar.ebnf`) replaces with the pattern's own lowering
  (:func:`detsample.grammar.regex.pattern_ebnf`): xgrammar's regex engine is bypassed.

The result is what detsample compiles; validation of outputs is always against the
user's original schema. :data:`KEYWORDS` is the supported-keyword table of
docs/grammar.md.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from detsample.errors import GrammarError
from detsample.grammar.formats import FORMAT_PATTERNS
from detsample.grammar.regex import pattern_ebnf

#: keyword -> what the grammar honours (the table of docs/grammar.md).
KEYWORDS: dict[str, str] = {
    "type": "a type name or a list of them",
    "enum": "any JSON values (siblings: only `type`, checked against every value)",
    "const": "any JSON value (siblings: only `type`)",
    "$ref": "local JSON pointers (`#`, `#/$defs/...`, `#/definitions/...`); no siblings",
    "$defs": "schemas reachable by `$ref`",
    "definitions": "as `$defs`",
    "anyOf": "any branches; no validation siblings",
    "oneOf": "branches with disjoint types, or objects told apart by a required `const`",
    "allOf": "exactly one member",
    "properties": "emitted in declared order",
    "required": "names of `properties`",
    "additionalProperties": "`false`, `true` or a schema",
    "patternProperties": "one pattern, no declared name matching it, no other extra keys",
    "propertyNames": "`pattern` or `minLength`/`maxLength`; declared names must satisfy it",
    "minProperties": "only when no extra keys are possible or it is <= len(required)",
    "maxProperties": "yes",
    "unevaluatedProperties": "`false` only",
    "items": "a schema or a boolean",
    "prefixItems": "yes",
    "minItems": "yes",
    "maxItems": "yes",
    "uniqueItems": "`false` only",
    "unevaluatedItems": "`false` only",
    "minimum": "integers and numbers",
    "maximum": "integers and numbers",
    "exclusiveMinimum": "numeric form",
    "exclusiveMaximum": "numeric form",
    "multipleOf": "integers only (positive integer)",
    "minLength": "code points (the string holds no escapes)",
    "maxLength": "as `minLength`",
    "pattern": "Python `re` syntax without backreferences, lookarounds, inline flags",
    "format": ", ".join(sorted(FORMAT_PATTERNS)),
}
#: Keywords with no effect on validity: accepted and ignored.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
        "$schema",
        "$id",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        "nullable",
        "discriminator",
        "strict",
    }
)
#: Known keywords the grammar cannot honour -> why.
UNSUPPORTED: dict[str, str] = {
    "not": "negation",
    "if": "conditionals",
    "then": "conditionals",
    "else": "conditionals",
    "dependentRequired": "dependencies",
    "dependentSchemas": "dependencies",
    "dependencies": "dependencies",
    "contains": "contains",
    "minContains": "contains",
    "maxContains": "contains",
    "additionalItems": "draft-07 tuples (use prefixItems)",
    "$anchor": "anchors",
    "$dynamicRef": "dynamic references",
    "$dynamicAnchor": "dynamic references",
    "$recursiveRef": "recursive references",
    "$recursiveAnchor": "recursive references",
    "$vocabulary": "vocabularies",
}
_SCHEMA_URIS = (
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft-07/schema",
    "http://json-schema.org/draft-06/schema",
)
_COMBINATORS = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")  # xgrammar's precedence
_STRING_KW = ("minLength", "maxLength", "pattern", "format")
_NUMBER_KW = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_ARRAY_KW = ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "unevaluatedItems")
_OBJECT_KW = (
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "unevaluatedProperties",
)
#: Prefix of the placeholder regexes (letters only: xgrammar keeps them verbatim).
PLACEHOLDER = "DETSAMPLEPATTERN"
_TYPES = ("string", "number", "integer", "boolean", "null", "array", "object")
_STRUCTURAL = frozenset({"$defs", "definitions"})


def _seg(name: str) -> str:
    """``name`` as one JSON-pointer segment."""
    return str(name).replace("~", "~0").replace("/", "~1")


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _overlap(a: set[str], b: set[str]) -> bool:
    return bool(a & b) or ("number" in a and "integer" in b) or ("integer" in a and "number" in b)


def _value_key(v: Any) -> str:
    return json.dumps([_json_type(v), v], sort_keys=True)


class _Walker:
    def __init__(self, root: Any, strict: bool) -> None:
        self.root = root
        self.strict = strict
        self.placeholders: dict[str, str] = {}  # EBNF expression -> placeholder regex

    # -- errors and references -------------------------------------------------------
    @staticmethod
    def fail(ptr: str, keyword: str, why: str) -> None:
        raise GrammarError(f"json_schema: keyword {keyword!r} at #{ptr} is not supported by the grammar backend: {why}")

    def resolve(self, ref: Any, ptr: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            self.fail(ptr, "$ref", f"only local references ('#...') are supported, got {ref!r}")
        node = self.root
        for part in [p for p in ref[1:].split("/") if p] if ref not in ("#", "#/") else []:
            part = part.replace("~1", "/").replace("~0", "~")
            try:
                node = node[int(part)] if isinstance(node, list) else node[part]
            except (KeyError, IndexError, ValueError, TypeError):
                self.fail(ptr, "$ref", f"{ref!r} does not resolve in this schema")
        return node

    # -- the walk --------------------------------------------------------------------
    def visit(self, node: Any, ptr: str, implied: str | None = None) -> Any:
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            raise GrammarError(
                f"json_schema: the schema at #{ptr} must be an object or a boolean, got {type(node).__name__}"
            )
        out = dict(node)  # key order kept: xgrammar emits properties in declared order
        for k, v in node.items():
            if k in UNSUPPORTED:
                self.fail(ptr, k, UNSUPPORTED[k] + " cannot be expressed")
            if k == "$schema" and (not isinstance(v, str) or v.rstrip("#") not in _SCHEMA_URIS):
                self.fail(ptr, k, f"dialect {v!r}; use draft 2020-12, 2019-09, 07 or 06")
            if k == "$id" and ptr:
                self.fail(ptr, k, "a nested $id changes how references resolve")
        for k in _STRUCTURAL & node.keys():
            defs = node[k]
            if not isinstance(defs, dict):
                self.fail(ptr, k, f"must be an object, got {type(defs).__name__}")
            out[k] = {n: self.visit(s, f"{ptr}/{k}/{_seg(n)}") for n, s in defs.items()}
        present = [k for k in _COMBINATORS if k in node]
        if present:
            return self.combinator(node, out, ptr, present)
        types = self.types(node, ptr, implied)
        self.require_type(node, ptr, types)
        if "string" in types:
            self.string(node, out, ptr)
        if types & {"integer", "number"}:
            self.number(node, ptr, types)
        if "array" in types:
            self.array(node, out, ptr)
        if "object" in types:
            self.object(node, out, ptr)
        return out

    def types(self, node: dict, ptr: str, implied: str | None) -> set[str]:
        t = node.get("type", implied)
        if t is None:
            if any(k in node for k in ("properties", "additionalProperties", "unevaluatedProperties")):
                return {"object"}
            if any(k in node for k in ("items", "prefixItems", "unevaluatedItems")):
                return {"array"}
            return set()
        names = t if isinstance(t, list) else [t]
        if not names or any(n not in _TYPES for n in names):
            self.fail(ptr, "type", f"expected names from {_TYPES}, got {t!r}")
        return set(names)

    def require_type(self, node: dict, ptr: str, types: set[str]) -> None:
        for kws, need in (
            (_STRING_KW, {"string"}),
            (_NUMBER_KW, {"integer", "number"}),
            (_ARRAY_KW, {"array"}),
            (_OBJECT_KW, {"object"}),
        ):
            for k in kws:
                if k in node and not types & need:
                    self.fail(
                        ptr, k, f'it needs "type": {sorted(need)[0]!r} next to it (the grammar ignores it otherwise)'
                    )

    def combinator(self, node: dict, out: dict, ptr: str, present: list[str]) -> Any:
        kw = present[0]
        if len(present) > 1:
            self.fail(ptr, present[1], f"next to {kw!r} it would be ignored")
        allowed = ANNOTATIONS | _STRUCTURAL | {kw}
        if kw in ("enum", "const"):
            allowed = allowed | {"type"}
        for k in node:
            if k not in allowed and (k in KEYWORDS or k in UNSUPPORTED):
                self.fail(ptr, k, f"next to {kw!r} it would be ignored")
        if kw == "$ref":
            self.resolve(node["$ref"], ptr)
            if not _walked(node["$ref"]):
                self.fail(
                    ptr,
                    "$ref",
                    f"{node['$ref']!r} points outside $defs, definitions, "
                    "properties, items and the combinators (it would not be checked)",
                )
            return out
        if kw in ("enum", "const"):
            values = node["enum"] if kw == "enum" else [node["const"]]
            if kw == "enum" and (not isinstance(values, list) or not values):
                self.fail(ptr, "enum", "must be a non-empty array")
            if "type" in node:
                types = self.types(node, ptr, None)
                for v in values:
                    if not _overlap({_json_type(v)}, types) or (_json_type(v) == "number" and types == {"integer"}):
                        self.fail(ptr, kw, f"value {v!r} does not have type {node['type']!r}")
            return out
        members = node[kw]
        if not isinstance(members, list) or not members:
            self.fail(ptr, kw, "must be a non-empty array")
        if kw == "allOf" and len(members) != 1:
            self.fail(ptr, kw, "only a single member is supported (merge the members)")
        out[kw] = [self.visit(m, f"{ptr}/{kw}/{i}") for i, m in enumerate(members)]
        if kw == "oneOf" and len(members) > 1:
            self.one_of(members, ptr)
        return out

    # -- oneOf: accepted only when no document can match two branches ----------------
    def signature(self, node: Any, depth: int = 0) -> set[str]:
        """JSON types a schema can produce (all when unknown)."""
        every = set(_TYPES)
        if node is True or not isinstance(node, dict) or depth > 32:
            return every if node is not False else set()
        if "$ref" in node:
            return self.signature(self.resolve(node["$ref"], ""), depth + 1)
        if "const" in node:
            return {_json_type(node["const"])}
        if "enum" in node and isinstance(node["enum"], list):
            return {_json_type(v) for v in node["enum"]}
        for kw in ("anyOf", "oneOf", "allOf"):
            if isinstance(node.get(kw), list):
                return set().union(*(self.signature(m, depth + 1) for m in node[kw]))
        types = self.types(node, "", None)
        return types or every

    def values(self, node: Any, depth: int = 0) -> set[str] | None:
        """The finite set of values of a const/enum schema, else None."""
        if isinstance(node, dict) and "$ref" in node and depth < 32:
            return self.values(self.resolve(node["$ref"], ""), depth + 1)
        if isinstance(node, dict) and "const" in node:
            return {_value_key(node["const"])}
        if isinstance(node, dict) and isinstance(node.get("enum"), list):
            return {_value_key(v) for v in node["enum"]}
        return None

    def deref(self, node: Any) -> Any:
        for _ in range(32):
            if not (isinstance(node, dict) and "$ref" in node):
                return node
            node = self.resolve(node["$ref"], "")
        return node

    def one_of(self, members: list, ptr: str) -> None:
        sigs = [self.signature(m) for m in members]
        if all(not _overlap(a, b) for i, a in enumerate(sigs) for b in sigs[i + 1 :]):
            return
        vals = [self.values(m) for m in members]
        if all(v is not None for v in vals) and all(not (a & b) for i, a in enumerate(vals) for b in vals[i + 1 :]):
            return
        objs = [self.deref(m) for m in members]
        if all(isinstance(o, dict) and self.signature(o) == {"object"} for o in objs):
            common = set.intersection(*(set(o.get("required", [])) for o in objs))
            for key in sorted(common):
                kv = [self.values((o.get("properties") or {}).get(key)) for o in objs]
                if all(v is not None for v in kv) and all(not (a & b) for i, a in enumerate(kv) for b in kv[i + 1 :]):
                    return
        self.fail(
            ptr,
            "oneOf",
            "its branches may overlap, and a document matching two "
            "branches would be invalid; use anyOf, or give every branch a required "
            "property with a distinct const",
        )

    # -- type-specific keywords ------------------------------------------------------
    def string(self, node: dict, out: dict, ptr: str) -> None:
        has = [k for k in ("pattern", "format") if k in node]
        if "minLength" in node or "maxLength" in node:
            has.append("minLength" if "minLength" in node else "maxLength")
        if len(has) > 1:
            self.fail(
                ptr,
                has[1],
                f"it cannot be combined with {has[0]!r} (xgrammar honours only one of pattern, format and lengths)",
            )
        for k in ("minLength", "maxLength"):
            v = node.get(k)
            if k in node and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                self.fail(ptr, k, f"must be an integer >= 0, got {v!r}")
        if "format" in node:
            f = node["format"]
            if f not in FORMAT_PATTERNS:
                self.fail(ptr, "format", f"format {f!r} is not one of {sorted(FORMAT_PATTERNS)}")
            del out["format"]
            out["pattern"] = self.pattern(FORMAT_PATTERNS[f], ptr, "format")
        if "pattern" in node:
            out["pattern"] = self.pattern(node["pattern"], ptr, "pattern")

    def pattern(self, p: Any, ptr: str, keyword: str) -> str:
        """The placeholder regex that stands for ``p`` until the grammar is corrected."""
        try:
            expr = pattern_ebnf(p)
        except GrammarError as e:
            self.fail(ptr, keyword, str(e))
        ph = self.placeholders.get(expr)
        if ph is None:
            ph = self.placeholders[expr] = f"{PLACEHOLDER}{len(self.placeholders)}Z"
        return ph

    def number(self, node: dict, ptr: str, types: set[str]) -> None:
        for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            if k not in node:
                continue
            v = node[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                self.fail(ptr, k, f"must be a number, got {v!r}")
            if "integer" in types and "number" not in types and isinstance(v, float) and not v.is_integer():
                self.fail(ptr, k, f"an integer's bound must be integral, got {v!r}")
        if "multipleOf" in node:
            m = node["multipleOf"]
            if "number" in types:
                self.fail(ptr, "multipleOf", "only integers can be constrained to multiples")
            if not (float(m).is_integer() and m > 0):
                self.fail(ptr, "multipleOf", f"must be a positive integer, got {m!r}")

    def array(self, node: dict, out: dict, ptr: str) -> None:
        if "items" in node:
            if isinstance(node["items"], list):
                self.fail(ptr, "items", "an array of schemas is draft-07 tuples; use prefixItems")
            out["items"] = self.visit(node["items"], f"{ptr}/items")
        if "prefixItems" in node:
            if not isinstance(node["prefixItems"], list):
                self.fail(ptr, "prefixItems", "must be an array of schemas")
            out["prefixItems"] = [self.visit(s, f"{ptr}/prefixItems/{i}") for i, s in enumerate(node["prefixItems"])]
        for k in ("uniqueItems", "unevaluatedItems"):
            if k in node and node[k] is not False:
                self.fail(ptr, k, "only `false` is supported")
        self.counts(node, ptr, "minItems", "maxItems")

    def counts(self, node: dict, ptr: str, lo: str, hi: str) -> None:
        for k in (lo, hi):
            v = node.get(k)
            if k in node and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                self.fail(ptr, k, f"must be an integer >= 0, got {v!r}")

    def object(self, node: dict, out: dict, ptr: str) -> None:
        props = node.get("properties", {})
        if not isinstance(props, dict):
            self.fail(ptr, "properties", "must be an object")
        out["properties"] = {n: self.visit(s, f"{ptr}/properties/{_seg(n)}") for n, s in props.items()}
        if not out["properties"] and "properties" not in node:
            del out["properties"]
        required = node.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            self.fail(ptr, "required", "must be an array of property names")
        extra = node.get("additionalProperties", None if self.strict else True)
        if extra is not None and not isinstance(extra, bool):
            out["additionalProperties"] = self.visit(extra, f"{ptr}/additionalProperties")
        free = extra not in (None, False)
        if "unevaluatedProperties" in node and node["unevaluatedProperties"] is not False:
            self.fail(ptr, "unevaluatedProperties", "only `false` is supported")
        pats = node.get("patternProperties")
        if pats is not None:
            if not isinstance(pats, dict) or len(pats) != 1:
                self.fail(ptr, "patternProperties", "exactly one pattern is supported")
            if free:
                self.fail(
                    ptr,
                    "patternProperties",
                    "with additionalProperties an extra key could match the pattern and be checked against its schema",
                )
            ((pat, sub),) = pats.items()
            if not isinstance(pat, str):
                self.fail(ptr, "patternProperties", f"pattern must be a string, got {pat!r}")
            rx = self.pattern(pat, ptr, "patternProperties")
            clash = [n for n in props if re.search(pat, n)]
            if clash:
                self.fail(
                    ptr,
                    "patternProperties",
                    f"declared properties {clash} match the "
                    "pattern, so their values would have to satisfy both schemas",
                )
            out["patternProperties"] = {rx: self.visit(sub, f"{ptr}/patternProperties/{_seg(pat)}")}
            free = True
        if "propertyNames" in node:
            names = node["propertyNames"]
            out["propertyNames"] = self.visit(names, f"{ptr}/propertyNames", implied="string")
            self.check_names(names, props, ptr)
        self.counts(node, ptr, "minProperties", "maxProperties")
        if free and node.get("minProperties", 0) > len(set(required)):
            self.fail(
                ptr,
                "minProperties",
                "extra keys may repeat (a JSON parser keeps one), "
                "so the count cannot be guaranteed; require enough properties instead",
            )

    def check_names(self, names: Any, props: dict, ptr: str) -> None:
        if not isinstance(names, dict):
            return
        import jsonschema

        schema = {"type": "string", **names}
        bad = [n for n in props if not jsonschema.Draft202012Validator(schema).is_valid(n)]
        if bad:
            self.fail(ptr, "propertyNames", f"declared properties {bad} do not satisfy it")


_SINGLE = frozenset({"items", "additionalProperties", "propertyNames"})
_NAMED = frozenset({"$defs", "definitions", "properties"})
_INDEXED = frozenset({"prefixItems", "anyOf", "oneOf", "allOf"})


def _walked(ref: str) -> bool:
    """True when the JSON pointer ``ref`` names a schema the walk visits (and rewrites)."""
    parts = [p for p in ref[1:].split("/") if p]
    i = 0
    while i < len(parts):
        p = parts[i]
        if p in _SINGLE:
            i += 1
        elif p in _NAMED and i + 1 < len(parts) or p in _INDEXED and i + 1 < len(parts) and parts[i + 1].isdigit():
            i += 2
        else:
            return False
    return True


class PreparedSchema:
    """A schema ready for xgrammar: ``schema`` with every pattern replaced by a
    placeholder regex, and ``patterns`` mapping each placeholder to the EBNF expression
    that replaces ``Regex("<placeholder>", json_string=true)`` in the generated grammar."""

    def __init__(self, schema: Any, patterns: dict[str, str]) -> None:
        self.schema = schema
        self.patterns = patterns


def prepare_json_schema(schema: Any, *, strict: bool = True) -> PreparedSchema:
    """Check ``schema`` (a dict, bool or JSON text) and return what detsample compiles.

    ``strict``: the compiler's strict mode (no properties or items the schema does not
    name). Raises :class:`GrammarError` naming the first unsupported keyword and its
    JSON pointer. The input is never modified.
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    walker = _Walker(copy.deepcopy(schema), strict)
    out = walker.visit(walker.root, "")
    return PreparedSchema(out, {ph: expr for expr, ph in walker.placeholders.items()})


def check_json_schema(schema: Any, *, strict: bool = True) -> None:
    """Raise :class:`GrammarError` when ``schema`` uses a keyword the grammar cannot honour."""
    prepare_json_schema(schema, strict=strict)
