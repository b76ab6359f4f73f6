"""Job dependencies (`--after`): a job that waits until others succeed, and fails naming the one
that did not; checked at submit through the CLI, the API and the client."""
