"""The bundled demo pair and workload (trained by ``python -m tools.demo_pair.train``) and the demo
target's EAGLE-3 head (``python -m tools.demo_pair.eagle3 --draft-vocab 1024 --budget-minutes 65
--train-prompts 2400 --out engine/demo/eagle3``)."""

from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
DEMO_TARGET = DEMO_DIR / "pair" / "target"
DEMO_DRAFT = DEMO_DIR / "pair" / "draft"
DEMO_PROMPTS = DEMO_DIR / "prompts.jsonl"
DEMO_EAGLE3 = DEMO_DIR / "eagle3"
