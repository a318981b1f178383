"""LLaVA: a CLIP or SigLIP tower and its projector (module `vision`, vision.py) feeding a Llama-style decoder
(module `llm`, runtime/models/decoder/); and a composed spec's bare CLIP or SigLIP tower, with a projector of
orch's into the LLM's width; their images by the tower's own image processor (processing.py). The family:
family.py."""
