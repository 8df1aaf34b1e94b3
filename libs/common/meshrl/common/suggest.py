""" "Did you mean …?": the nearest known name to a misspelt one, for every error message that names a fix.
Used by config loading, workflow validation, sampling keys and engine arguments.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_match(word: object, choices: Iterable[str]) -> str | None:
    """The known name closest to `word`, or None when nothing is close."""
    found = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: object, choices: Iterable[str], otherwise: str, template: str = "{}") -> str:
    """`did you mean 'X'?` for the nearest choice (shown through `template`), else the `otherwise` fix."""
    close = close_match(word, choices)
    return f"did you mean '{template.format(close)}'?" if close else otherwise
