"""The HTTP server: OpenAI-compatible API over the engine."""
