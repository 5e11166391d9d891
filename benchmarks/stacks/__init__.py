"""Inside the serving stacks (vLLM, llama-server): transfer, per-load schedules, drafters, scale."""
