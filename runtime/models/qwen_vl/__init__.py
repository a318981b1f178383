"""The Qwen-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): a native-resolution vision tower over packed images and
videos of any size (module `vision`, vision.py) feeding a Qwen decoder with M-RoPE positions (module `llm`,
language.py; positions: rope.py); docs/qwen_vl.md. The family: family.py."""
