"""Decoding with a KV cache: a decoder's past key/values as a fixed-capacity cache written
in place (static_cache: the graph rewrite; Decoder: compile once per new-token count, run
steps with the cache buffers bound as inputs and outputs)."""

from kiln.decode.decoder import Decoder, KVCache
from kiln.decode.static_cache import CachePair, NotStaticCache, StaticCache, static_cache

__all__ = ["CachePair", "Decoder", "KVCache", "NotStaticCache", "StaticCache", "static_cache"]
