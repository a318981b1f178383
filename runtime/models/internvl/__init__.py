"""InternVL (InternVL 2.5 / 3 / 3.5, HF's `-hf` directories): an InternViT tower, pixel shuffle and projector
(module `vision`, vision.py) over fixed-size tiles, feeding a Qwen2 or Llama decoder (module `llm`,
runtime/models/decoder/); its config read by config.py, its images tiled and counted by media.py and
processed by processing.py. The family: family.py."""
