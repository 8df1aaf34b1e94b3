"""The prompts a job draws: datasets (jsonl, parquet, Hugging Face folders), the chat-template encoder, the
seeded per-epoch sampler and the data position that checkpoints save. Read by DATA_LOAD nodes, the held-out
evaluation and the supervised warm-up.
"""
