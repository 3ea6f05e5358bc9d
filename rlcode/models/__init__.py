"""Models: the Qwen2/Llama decoder, Hugging Face checkpoint import/export, tokenizers."""

from rlcode.models.config import ModelConfig, from_hf_config, to_hf_config
from rlcode.models.decoder import Decoder, KVCache
from rlcode.models.hf import load_hf, save_hf
from rlcode.models.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

__all__ = ["ByteTokenizer", "Decoder", "HFTokenizer", "KVCache", "ModelConfig",
           "from_hf_config", "load_hf", "load_tokenizer", "save_hf", "to_hf_config"]
