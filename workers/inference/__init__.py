"""The inference runtime of `grpo-service serve`: models loaded with transformers (full weights,
or a peft adapter on a shared base), kept in an LRU, and concurrent requests decoded together.

`pool.py` loads and keeps models, `decode.py` runs one batch, `engine.py` collects requests into
batches on one thread. Nothing here knows HTTP, the database or the service around it.
"""
