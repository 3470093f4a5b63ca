"""`grpo-service serve`: the OpenAI-compatible inference backend the API proxies to (its own
process: it loads torch; `service.app` never imports it)."""
