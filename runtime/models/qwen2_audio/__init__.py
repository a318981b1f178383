"""Qwen2-Audio: a Whisper-style audio tower and its projector (module `audio`, audio.py) feeding a Qwen2
decoder (module `llm`, runtime/models/decoder/); and a composed spec's bare Whisper encoder, with a projector
of orch's merging `downsample` tokens into one LLM token; their clips by the tower's own feature extractor
(processing.py), counted by media.py. The family: family.py."""
