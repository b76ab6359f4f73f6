"""Signed webhooks, sent: which endpoints may be reached (`targets.py`: MXQ_HOOK_ALLOWED_HOSTS,
the addresses a name resolves to; the list itself is parsed with the settings, as
`workers.settings.webhooks.HookAllowlist`), how a delivery is signed (`signing.py`), and the sender the
schedule process runs (`sender.py`: due deliveries claimed from the outbox and POSTed from
threads of their own, so a slow endpoint holds no task of the control queue).

Imports (of mxq): core, db, workers.settings.
"""
