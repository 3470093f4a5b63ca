"""Swagger UI at `/docs`, served from this machine, never a CDN: Swagger UI 5's files as the
`fastapi-offline` package ships them, and a start script of our own. The page runs under the
dashboard's Content-Security-Policy (own scripts and styles, this origin only), which an inline
start script, as FastAPI's own page has, would break. `GRPO_DOCS_ENABLED=false` turns it off;
`/openapi.json` stays (the contract requires it)."""
