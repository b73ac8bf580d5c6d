"""OpenAI-compatible endpoints."""
