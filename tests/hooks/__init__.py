"""Signed webhooks: the outbox in SQL, the sender, the allowlist, a real receiver."""
