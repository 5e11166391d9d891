"""The engine on this host: speed, quality and cost-model claims of docs/results/engine-cpu.md."""
