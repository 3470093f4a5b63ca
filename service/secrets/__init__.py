"""Tenant secrets: write-only, encrypted credentials (trackers' API keys)."""
