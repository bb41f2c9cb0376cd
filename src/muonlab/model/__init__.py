"""The baseline GPT, its extension points and the registered model variants."""

from muonlab.model.extensions import REGISTRY, ModelVariant, describe, find_variant, register_variant
from muonlab.model.gpt import GPT, GPTConfig
from muonlab.model.variants.over_encoding import OverEncoding
from muonlab.model.variants.qk_scale import stop_exp
from muonlab.model.variants.radius_gate import radius_gate_scale
from muonlab.model.variants.residual_rules import residual_add
from muonlab.model import variants  # noqa: E402,F401  (registers the built-in variants)

__all__ = ["GPT", "GPTConfig", "ModelVariant", "OverEncoding", "REGISTRY", "describe", "find_variant",
           "radius_gate_scale", "register_variant", "residual_add", "stop_exp"]
