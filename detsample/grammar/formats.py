"""JSON-Schema ``format`` values the grammar honours, as the patterns that replace them.

xgrammar lowers a ``format`` to its own regex, and several of those admit strings the
format's checker rejects: ``date`` admits 2023-02-31 and year 0000, ``ipv4`` admits
leading zeros (``01.2.3.4``, which :mod:`ipaddress` refuses), ``time`` admits second 60,
``email`` admits backslash escapes that are not JSON escapes. detsample therefore
replaces each supported ``format`` with a stricter pattern below (Python ``re`` syntax,
translated like any ``pattern`` by :mod:`detsample.grammar.regex`); every string it
matches passes the format's check in ``jsonschema.FormatChecker`` (RFC 3339 dates and
times, :mod:`ipaddress`, :class:`uuid.UUID`). A ``format`` outside this table is
rejected at compile time.
"""

from __future__ import annotations

_YEAR = r"(?:000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})"  # 0001-9999 (Python has no year 0)
_MULT4 = r"(?:0[48]|[2468][048]|[13579][26])"  # 04, 08, ..., 96
_LEAP_YEAR = rf"(?:\d\d{_MULT4}|{_MULT4}00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])"
    rf"|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))"
    rf"|{_LEAP_YEAR}-02-29)"
)
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_H16 = r"[0-9a-fA-F]{1,4}"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?"  # 1-62 characters
# Email domains are not checked by jsonschema: unbounded labels compile 10x faster.
_DOMAIN_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"

#: format -> the pattern that replaces it (all anchored, ASCII only).
FORMAT_PATTERNS: dict[str, str] = {
    "date": rf"^{_DATE}$",
    "time": rf"^{_TIME}$",
    "date-time": rf"^{_DATE}T{_TIME}$",
    "email": rf"^{_ATEXT}+(?:\.{_ATEXT}+){{0,3}}@{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL}){{0,3}}$",
    "ipv4": rf"^(?:{_OCTET}\.){{3}}{_OCTET}$",
    "ipv6": (
        rf"^(?:(?:{_H16}:){{7}}{_H16}|(?:{_H16}:){{1,7}}:|(?:{_H16}:){{1,6}}:{_H16}"
        rf"|(?:{_H16}:){{1,5}}(?::{_H16}){{1,2}}|(?:{_H16}:){{1,4}}(?::{_H16}){{1,3}}"
        rf"|(?:{_H16}:){{1,3}}(?::{_H16}){{1,4}}|(?:{_H16}:){{1,2}}(?::{_H16}){{1,5}}"
        rf"|{_H16}:(?::{_H16}){{1,6}}|:(?::{_H16}){{1,7}}|::)$"
    ),
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "hostname": rf"^{_LABEL}(?:\.{_LABEL}){{0,3}}$",  # <= 4 labels: at most 251 characters
}
