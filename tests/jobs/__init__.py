"""A job's life in SQL and the broker: the state machine, schema, messages and Kombu, submit,
cancel, repair."""
