"""Transformers built from `transformers` configs written here (random weights, no hub), each
wrapped so that forward takes plain tensors and returns the last hidden state.

Depth is reduced where the layers only repeat (the README lists each model's config): every
layer has the published width, heads and MLP size, so the kernels kiln meets are the real ones.
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.corpus.spec import Input, Spec

VOCAB = 30522


class Encoder(nn.Module):
    """HF model -> forward(*tensors) returning last_hidden_state (the inputs by keyword)."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args)), return_dict=True).last_hidden_state


def hf(model_cls: str, config_cls: str, names, **config):
    def make():
        import importlib
        import transformers
        cfg = getattr(transformers, config_cls)(use_cache=False, **config)
        cfg._attn_implementation = "eager"
        module, _, cls = model_cls.rpartition(".")
        owner = importlib.import_module(f"transformers.models.{module}") if module else transformers
        return Encoder(getattr(owner, cls)(cfg), names)
    return make


def text_inputs(vocab, with_types=False):
    ids = [Input("input_ids", ("batch", "seq"), "int64", 0, vocab),
           Input("attention_mask", ("batch", "seq"), "int64", 1, 2)]
    if with_types:
        ids.append(Input("token_type_ids", ("batch", "seq"), "int64", 0, 2))
    return tuple(ids)


SEQ_CASES = ({"batch": 1, "seq": 32}, {"batch": 1, "seq": 256}, {"batch": 8, "seq": 32})
TRACE = {"batch": 2, "seq": 16}
BERT = dict(vocab_size=VOCAB, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
            max_position_embeddings=512)

MODELS = [
    Spec("bert_base", "transformer",
         hf("BertModel", "BertConfig", ["input_ids", "attention_mask", "token_type_ids"], num_hidden_layers=4,
            **BERT), text_inputs(VOCAB, True), SEQ_CASES, TRACE, opset=14,
         note="4 of 12 layers"),
    Spec("distilbert", "transformer",
         hf("DistilBertModel", "DistilBertConfig", ["input_ids", "attention_mask"], vocab_size=VOCAB, dim=768,
            n_layers=3, n_heads=12, hidden_dim=3072), text_inputs(VOCAB), SEQ_CASES, TRACE, opset=17,
         note="3 of 6 layers"),
    Spec("albert", "transformer",
         hf("AlbertModel", "AlbertConfig", ["input_ids", "attention_mask", "token_type_ids"], vocab_size=30000,
            embedding_size=128, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
            num_hidden_layers=12, max_position_embeddings=512),
         text_inputs(30000, True), SEQ_CASES, TRACE, opset=15, note="ALBERT-base: 12 layers sharing weights"),
    Spec("roberta", "transformer",
         hf("RobertaModel", "RobertaConfig", ["input_ids", "attention_mask"], vocab_size=50265, num_hidden_layers=4,
            hidden_size=768, num_attention_heads=12, intermediate_size=3072, max_position_embeddings=514,
            pad_token_id=1), text_inputs(50265), SEQ_CASES, TRACE, opset=16, note="4 of 12 layers"),
    Spec("gpt2", "transformer",
         hf("GPT2Model", "GPT2Config", ["input_ids", "attention_mask"], vocab_size=50257, n_layer=4, n_embd=768,
            n_head=12, n_positions=1024), text_inputs(50257), SEQ_CASES, TRACE, opset=17,
         note="4 of 12 layers"),
    Spec("llama_gqa", "transformer",
         hf("LlamaModel", "LlamaConfig", ["input_ids", "attention_mask"], vocab_size=32000, hidden_size=1024,
            intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
            max_position_embeddings=2048, rms_norm_eps=1e-5),
         text_inputs(32000), SEQ_CASES, TRACE, opset=18,
         note="hidden 1024, 16 heads / 4 KV heads, 4 layers (a TinyLlama-shaped layer, narrower)"),
    Spec("t5_encoder", "transformer",
         hf("T5EncoderModel", "T5Config", ["input_ids", "attention_mask"], vocab_size=32128, d_model=512,
            d_kv=64, d_ff=2048, num_layers=6, num_heads=8, feed_forward_proj="relu"),
         text_inputs(32128), SEQ_CASES, TRACE, opset=17, note="T5-small encoder, full size"),
    Spec("vit_b16", "transformer",
         hf("ViTModel", "ViTConfig", ["pixel_values"], image_size=224, patch_size=16, hidden_size=768,
            num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072),
         (Input("pixel_values", ("batch", 3, 224, 224)),), ({"batch": 1}, {"batch": 4}), {"batch": 2},
         opset=17, note="4 of 12 layers"),
    Spec("whisper_encoder", "transformer",
         hf("whisper.modeling_whisper.WhisperEncoder", "WhisperConfig", ["input_features"], d_model=384, encoder_layers=4,
            encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80, max_source_positions=750),
         (Input("input_features", ("batch", 80, 1500)),), ({"batch": 1}, {"batch": 4}), {"batch": 2},
         opset=17, note="Whisper-tiny widths, 15 s of audio (1500 mel frames) instead of 30 s"),
    Spec("wav2vec2", "transformer",
         hf("Wav2Vec2Model", "Wav2Vec2Config", ["input_values"], hidden_size=768, num_hidden_layers=2,
            num_attention_heads=12, intermediate_size=3072, do_stable_layer_norm=False,
            feat_extract_norm="group"),
         (Input("input_values", ("batch", "samples")),),
         ({"batch": 1, "samples": 16000}, {"batch": 1, "samples": 48000}), {"batch": 2, "samples": 16000},
         opset=17, note="the full conv feature extractor, 2 of 12 transformer layers"),
]
