"""Models: the decoder (Qwen2/3, MoE, Llama, Mistral, Gemma 3, OLMo 2, Phi-3), Hugging Face
checkpoint import/export, tokenizers."""

from rlcode.models.config import ModelConfig, MoEConfig
from rlcode.models.hf_config import from_hf_config, to_hf_config
from rlcode.models.decoder import Decoder, KVCache
from rlcode.models.hf import load_hf, save_hf
from rlcode.models.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

__all__ = ["ByteTokenizer", "Decoder", "HFTokenizer", "KVCache", "ModelConfig", "MoEConfig",
           "from_hf_config", "load_hf", "load_tokenizer", "save_hf", "to_hf_config"]
