"""The bundled demo pair and workload (trained by ``python -m tools.demo_pair.train``)."""

from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
DEMO_TARGET = DEMO_DIR / "pair" / "target"
DEMO_DRAFT = DEMO_DIR / "pair" / "draft"
DEMO_PROMPTS = DEMO_DIR / "prompts.jsonl"
