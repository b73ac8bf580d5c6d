"""Streaming parsers over generated output: reasoning (by token id) and tool calls (by text)."""
