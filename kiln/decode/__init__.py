"""Decoding with a KV cache: a decoder's past key/values as a fixed-capacity cache written
in place (static_cache: the graph rewrite of ONNX Attention's past/present; concat_cache: of the
Concat form torch.onnx.export writes; Decoder: compile once per new-token count, run
steps with the cache buffers bound as inputs and outputs)."""

from kiln.decode.concat_cache import ConcatCache, concat_cache
from kiln.decode.decoder import Decoder, KVCache
from kiln.decode.static_cache import CachePair, NotStaticCache, StaticCache, static_cache

__all__ = ["CachePair", "ConcatCache", "Decoder", "KVCache", "NotStaticCache", "StaticCache", "concat_cache",
           "static_cache"]
