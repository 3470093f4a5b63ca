"""Webhooks (Standard Webhooks): subscriptions, a transactional outbox, a signing dispatcher."""
