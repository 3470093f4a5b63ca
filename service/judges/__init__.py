"""Model judges, the service's side: where a tenant's judges may call and which models they may
name (workers/verifiers/judge.py runs them)."""
