"""Reliability suite: ``vllm serve`` under aborts, KV pressure, length limits, prefix
caching, speculative decoding and a soak (``run_reliability.py``)."""
