"""Llama-style decoders (llama, qwen2, mistral; the language model of every multimodal family): the family
(family.py) and transformers' own layers as orch's CausalLM (causal_lm.py)."""
