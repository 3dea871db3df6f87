"""A stand-in for vLLM whose ``serve`` is a tiny OpenAI-compatible server (see
entrypoints/cli/main.py) for the reliability suite's CPU tests."""

__version__ = "0.0.fake-reliability"
