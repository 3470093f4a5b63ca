"""Alembic migrations of the service's database, shipped inside the package so that an installed
`grpo-service migrate` (or `up`) finds them (`service.core.migrate` locates this folder)."""
