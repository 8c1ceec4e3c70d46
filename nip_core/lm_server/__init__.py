"""Self-hosted language-model server with an OpenAI-compatible API (chat, files, fine-tuning)."""
