"""Hugging Face models under orch's plans: transformers' own classes wrapped in orch's module contract."""
