"""Puts the repository root on sys.path so the example package (`examples.countdown`) imports in these tests."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[3])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
