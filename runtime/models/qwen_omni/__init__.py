"""Qwen2.5-Omni's thinker (`model_type: qwen2_5_omni`; docs/qwen_omni.md): an audio tower of chunked attention
(module `audio`, audio.py) and the Qwen2.5-VL vision tower (module `vision`, runtime/models/qwen_vl/vision.py)
feeding a Qwen2 decoder with TMRoPE positions (module `llm`, runtime/models/qwen_vl/language.py; positions:
rope.py). The talker and token2wav are not trained: `orch export` writes them back as they came. Its config is
read by config.py, its clips counted by media.py. The family: family.py."""
