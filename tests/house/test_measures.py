"""Issue 59's measures of the product code (api cli client core db tasks workers), kept: a room
that grows past them is split or simplified before it lands, not after a round of growth.

- no module over MAX_MODULE_LINES lines;
- at most MOST_COMPLEX functions over complexity MAX_COMPLEXITY (radon's cyclomatic complexity,
  the measure `ruff`'s C901 approximates);
- at most MOST_ANY uses of `typing.Any` in annotations: JSON has its types (mxq.json_types), and
  a value only passed along is an `object`.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Function

from tests.conftest import ROOT

PRODUCT = ("api", "cli", "client", "core", "db", "tasks", "workers")
MAX_MODULE_LINES = 500
MAX_COMPLEXITY = 12
MOST_COMPLEX = 15
MOST_ANY = 150


def _modules() -> list[Path]:
    return sorted(p for folder in PRODUCT for p in (ROOT / folder).rglob("*.py")
                  if "migrations" not in p.parts)


def _functions(code: str) -> list[Function]:
    """Every function and method of a module (radon lists a class's methods both inside it and
    on their own, so the classes are left out)."""
    return [block for block in cc_visit(code) if isinstance(block, Function)]


def _any_uses(code: str) -> int:
    """`Any` as a name in the code, not in its imports, comments or strings."""
    count, importing = 0, False
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.NAME and token.string in ("import", "from") and token.start[1] == 0:
            importing = True
        elif token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            importing = False
        elif token.type == tokenize.NAME and token.string == "Any" and not importing:
            count += 1
    return count


def test_no_module_is_over_the_line_limit() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_few_functions_are_over_the_complexity_limit() -> None:
    complex_ = sorted(f"{p.relative_to(ROOT)}:{f.fullname} ({f.complexity})" for p in _modules()
                      for f in _functions(p.read_text()) if f.complexity > MAX_COMPLEXITY)
    assert len(complex_) <= MOST_COMPLEX, "\n".join(complex_)


def test_any_is_rare_in_annotations() -> None:
    uses = {str(p.relative_to(ROOT)): n for p in _modules() if (n := _any_uses(p.read_text()))}
    worst = sorted(uses.items(), key=lambda kv: -kv[1])[:10]
    assert sum(uses.values()) <= MOST_ANY, f"{sum(uses.values())} uses of Any; most in {worst}"


def test_the_measures_catch_what_they_measure() -> None:
    """The counters count: a function of 13 branches is over the limit, `Any` in an annotation
    counts, and `Any` in an import, a comment or a string does not."""
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(13))
    [f] = _functions(f"def f(x):\n{branches}    return -1\n")
    assert f.complexity > MAX_COMPLEXITY
    code = 'from typing import Any\n# Any here\ndef g(a: Any) -> "Any":\n    """Any."""\n    return a\n'
    assert _any_uses(code) == 1
