"""The model catalog: base models the operator registered, and what tenants train from."""
