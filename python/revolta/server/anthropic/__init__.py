"""Anthropic Messages API over the same engine, parsers and errors as the chat endpoint."""
