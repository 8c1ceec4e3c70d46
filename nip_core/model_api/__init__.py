"""What both sides of the OpenAI-compatible model API share, below both of them.

Our chat clients (`nip_core.agents`) and our server (`nip_core.lm_server`, a product of its own)
must agree on the chat messages a model is shown (`chat_format`), on what the offline dummy
model answers (`dummy_player`), on the DPO loss names of our fine-tuning extension
(`dpo_losses`) and on where a JSONL file's lines end (`jsonl`). Neither side may import the
other, so these live here and import nothing else from `nip_core`
(tests/test_import_direction.py).
"""
