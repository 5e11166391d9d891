"""How the demo pair shipped in ``engine/demo/pair`` was made; not part of the installed package.

- ``python -m tools.demo_pair.train``: the reproducible training of the pair (:mod:`tools.demo_pair.train`),
  with the on-policy distillation phase in :mod:`tools.demo_pair.onpolicy`.
- ``python -m tools.demo_pair.pad_head_dim``: the function-preserving reshape of the target to
  head_dim 64 (vLLM's CPU attention needs it; see docs/backends.md).

Run from the repository root. The engine only reads the result (``engine.demo``: the pair and
``prompts.jsonl``).
"""
