"""Measuring: compiled-kernel facts, Nsight Compute and torch.profiler runs, the recorded results, and the
measurements ``python -m flashattn.record`` runs (``measure/measurements/``)."""
