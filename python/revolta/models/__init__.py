"""Model resolution, tokenizers, chat templates and checkpoint importers."""
