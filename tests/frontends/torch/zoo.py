"""Small torch models for the frontend tests, written in plain torch (and from transformers
configs where transformers is installed): each entry builds (module, example inputs)."""

from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hid = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6()]
        layers += [nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
                   nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2), (6, 64, 1, 2)]
        layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
        cin = 32
        for t, c, n, s in cfg:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 128, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(128, classes))

    def forward(self, x):
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1)).flatten(1)
        return self.classifier(x)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d=64, heads=4, kv_heads=2, hidden=128):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, heads * self.hd, bias=False)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(heads * self.hd, d, bias=False)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.h // self.kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.triu(torch.full((t, t), float("-inf"), device=x.device), diagonal=1)
        att = torch.softmax(att + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(y)
        return x + self.down(F.silu(self.gate(self.n2(x))) * self.up(self.n2(x)))


class Llama(nn.Module):
    def __init__(self, vocab=100, d=64, layers=2, heads=4, kv_heads=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([LlamaBlock(d, heads, kv_heads) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd)))

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device).float()
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))


class LSTMTagger(nn.Module):
    def __init__(self, vocab=50, emb=16, hidden=24, tags=7, bidirectional=False, layers=1):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.out = nn.Linear(hidden * (2 if bidirectional else 1), tags)

    def forward(self, ids):
        y, _ = self.lstm(self.emb(ids))
        return F.log_softmax(self.out(y), dim=-1)


class GPTBlock(nn.Module):
    """GPT-2 style: pre-LN, fused qkv, causal attention via scaled_dot_product_attention, tanh GELU."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=100, d=64, layers=2, ctx=32, heads=4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.Sequential(*[GPTBlock(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.ln(self.blocks(self.wte(ids) + self.wpe(pos))))


class BertLike(nn.Module):
    """BERT style: post-LN encoder with an attention mask, erf GELU, pooler, two outputs in a dict."""

    def __init__(self, vocab=100, d=64, heads=4, layers=2, ctx=32, ff=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.ln = nn.LayerNorm(d)
        self.heads = heads
        self.layers = nn.ModuleList()
        for _ in range(layers):
            self.layers.append(nn.ModuleDict(dict(q=nn.Linear(d, d), k=nn.Linear(d, d), v=nn.Linear(d, d),
                                                  o=nn.Linear(d, d), ln1=nn.LayerNorm(d), ff1=nn.Linear(d, ff * d),
                                                  ff2=nn.Linear(ff * d, d), ln2=nn.LayerNorm(d))))
        self.pool = nn.Linear(d, d)

    def forward(self, ids, mask):
        b, t = ids.shape
        x = self.ln(self.emb(ids) + self.pos(torch.arange(t, device=ids.device)))
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        hd = x.shape[-1] // self.heads
        for L in self.layers:
            def split(z):
                return z.view(b, t, self.heads, hd).permute(0, 2, 1, 3)
            q, k, v = split(L["q"](x)), split(L["k"](x)), split(L["v"](x))
            a = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd) + bias
            y = torch.matmul(a.softmax(-1), v).permute(0, 2, 1, 3).reshape(b, t, -1)
            x = L["ln1"](x + L["o"](y))
            x = L["ln2"](x + L["ff2"](F.gelu(L["ff1"](x))))
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))

    def forward(self, x):
        return self.net(x)


def _ids(vocab, b, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, t), generator=g)


def _randn(*shape):
    return torch.randn(*shape)


def _encoder_layer(norm_first):
    m = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first)
    return m, (_randn(2, 7, 32),)


def _bert_hf():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    ids = _ids(100, 2, 9)
    return _Outputs(BertModel(cfg)), (ids, torch.ones_like(ids))


def _gpt2_hf():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False,
                     attn_implementation="eager")
    return _Outputs(GPT2LMHeadModel(cfg)), (_ids(100, 2, 9),)


def _llama_hf():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      use_cache=False, attn_implementation="eager")
    return _Outputs(LlamaForCausalLM(cfg)), (_ids(100, 2, 9),)


class _Outputs(nn.Module):
    """A transformers model with its ModelOutput turned into a plain dict of tensors."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *args):
        out = self.m(*args, return_dict=True)
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


# name -> builder returning (module, example inputs); "slow" ones are marked by the tests
MODELS = {
    "mlp": lambda: (MLP(), (_randn(4, 16),)),
    "resnet": lambda: (ResNet(), (_randn(1, 3, 32, 32),)),
    "mobilenet_v2": lambda: (MobileNetV2(), (_randn(1, 3, 32, 32),)),
    "llama": lambda: (Llama(), (_ids(100, 2, 9),)),
    "gpt": lambda: (GPT(), (_ids(100, 2, 9),)),
    "bert": lambda: (BertLike(), (_ids(100, 2, 9), torch.tensor([[1] * 9, [1] * 6 + [0] * 3]))),
    "lstm_tagger": lambda: (LSTMTagger(), (_ids(50, 2, 6),)),
    "bilstm_tagger": lambda: (LSTMTagger(bidirectional=True, layers=2), (_ids(50, 2, 6),)),
    "encoder_layer": lambda: _encoder_layer(False),
    "encoder_layer_norm_first": lambda: _encoder_layer(True),
    "bert_hf": _bert_hf,
    "gpt2_hf": _gpt2_hf,
    "llama_hf": _llama_hf,
}
