"""A user's `--model-factory` for the tests: orch's reference blocks with their own projector.

`two_layer_projectors` keeps orch's encoders and LLM but replaces every encoder's projector by
a two-layer MLP (LLaVA-1.5 style); `not_a_mapping` and `missing_llm` break the contract.
"""

from torch import nn

from orch.runtime.models.reference import build_module


class MLPProjector(nn.Module):
    def __init__(self, enc_hidden: int, llm_hidden: int, downsample: int) -> None:
        super().__init__()
        self.downsample = downsample
        self.fc1 = nn.Linear(enc_hidden * downsample, llm_hidden)
        self.fc2 = nn.Linear(llm_hidden, llm_hidden)

    def forward(self, x_TD, seqlens):
        ds = self.downsample
        if ds > 1:
            parts = []
            for s in x_TD.split(seqlens):
                pad = -(-s.shape[0] // ds) * ds - s.shape[0]
                parts.append(nn.functional.pad(s, (0, 0, 0, pad)).reshape(-1, ds * s.shape[1]))
            x_TD = torch_cat(parts, ds * x_TD.shape[1], x_TD)
        return self.fc2(nn.functional.gelu(self.fc1(x_TD)))


def torch_cat(parts, width, like):
    import torch

    return torch.cat(parts) if parts else like.reshape(0, width)


def two_layer_projectors(model):
    modules = {name: build_module(name, model) for name in model.modules}
    for e in model.encoder_names:
        spec = model.modules[e]
        modules[e].projector = MLPProjector(spec.hidden, model.llm.hidden, spec.downsample)
    return modules


def not_a_mapping(model):
    return [build_module(name, model) for name in model.modules]


def missing_llm(model):
    return {name: build_module(name, model) for name in model.encoder_names}


def raises(model):
    raise ValueError("no GPU here")
