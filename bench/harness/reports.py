"""Where the studies write their reports, and how."""

from __future__ import annotations

from pathlib import Path

REPORTS = Path(__file__).resolve().parents[1] / "reports"  # every study's default --out
