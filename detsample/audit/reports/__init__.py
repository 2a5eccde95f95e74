"""Reports: what an audit says.

:mod:`.issues` (excluded sequences and fatal input errors), :mod:`.report` (the terminal
summary, the HTML page and its plots), :mod:`.provenance` (what produced a report, and
its verdict).
"""
