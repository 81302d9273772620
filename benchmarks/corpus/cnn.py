"""Convolutional nets in plain torch (no torchvision): the architectures users run on CPUs,
at their published widths unless the README says otherwise. Randomly initialised."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.corpus.spec import Input, Spec


def conv_bn(cin, cout, k=3, s=1, groups=1, act=nn.ReLU, dilation=1):
    layers = [nn.Conv2d(cin, cout, k, s, dilation * (k - 1) // 2, dilation=dilation, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


# ---- ResNet-50 / ResNeXt-50 (bottleneck blocks; groups for ResNeXt) ----------------------------

class Bottleneck(nn.Module):
    def __init__(self, cin, planes, stride, groups, width_per_group):
        super().__init__()
        width = int(planes * width_per_group / 64) * groups
        self.body = nn.Sequential(conv_bn(cin, width, 1), conv_bn(width, width, 3, stride, groups),
                                  conv_bn(width, planes * 4, 1, act=None))
        self.down = (conv_bn(cin, planes * 4, 1, stride, act=None)
                     if stride != 1 or cin != planes * 4 else nn.Identity())

    def forward(self, x):
        return F.relu(self.body(x) + self.down(x))


class ResNet(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), groups=1, width_per_group=64, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, n in enumerate(layers):
            planes = 64 * 2 ** i
            for j in range(n):
                blocks.append(Bottleneck(cin, planes, 2 if j == 0 and i > 0 else 1, groups, width_per_group))
                cin = planes * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---- MobileNetV2 -----------------------------------------------------------------------------

class InvertedResidual(nn.Module):
    """MobileNetV2/V3 and EfficientNet block: expand 1x1, depthwise kxk, optional
    squeeze-excite, project 1x1; residual when shapes allow."""

    def __init__(self, cin, cout, k, stride, hidden, act=nn.ReLU6, se=None):
        super().__init__()
        layers = [conv_bn(cin, hidden, 1, act=act)] if hidden != cin else []
        layers += [conv_bn(hidden, hidden, k, stride, groups=hidden, act=act)]
        if se is not None:
            layers.append(se(hidden))
        layers.append(conv_bn(hidden, cout, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class Pooled(nn.Module):
    """features -> global average pool -> head: the classifier ending of the mobile nets."""

    def __init__(self, features, head):
        super().__init__()
        self.features, self.head = features, head

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def mobilenet_v2(classes=1000):
    cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
           (6, 320, 1, 1)]
    layers, cin = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
    for t, c, n, s in cfg:
        for i in range(n):
            layers.append(InvertedResidual(cin, c, 3, s if i == 0 else 1, cin * t))
            cin = c
    layers.append(conv_bn(cin, 1280, 1, act=nn.ReLU6))
    return Pooled(nn.Sequential(*layers), nn.Linear(1280, classes))


# ---- MobileNetV3 (hard-swish, squeeze-excite with hard-sigmoid) -------------------------------

class SqueezeExcite(nn.Module):
    def __init__(self, c, reduce=4, act=nn.ReLU, gate=nn.Hardsigmoid, squeeze=None):
        super().__init__()
        mid = squeeze or max(8, (c // reduce + 4) // 8 * 8)
        self.fc1, self.fc2, self.act, self.gate = nn.Conv2d(c, mid, 1), nn.Conv2d(mid, c, 1), act(), gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


MBV3_LARGE = [  # k, expanded, out, se, act, stride
    (3, 16, 16, False, "RE", 1), (3, 64, 24, False, "RE", 2), (3, 72, 24, False, "RE", 1),
    (5, 72, 40, True, "RE", 2), (5, 120, 40, True, "RE", 1), (5, 120, 40, True, "RE", 1),
    (3, 240, 80, False, "HS", 2), (3, 200, 80, False, "HS", 1), (3, 184, 80, False, "HS", 1),
    (3, 184, 80, False, "HS", 1), (3, 480, 112, True, "HS", 1), (3, 672, 112, True, "HS", 1),
    (5, 672, 160, True, "HS", 2), (5, 960, 160, True, "HS", 1), (5, 960, 160, True, "HS", 1)]
MBV3_SMALL = [
    (3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
    (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
    (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
    (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1)]


def mobilenet_v3(cfg, last, head, classes=1000):
    layers, cin = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)], 16
    for k, exp, out, se, act, s in cfg:
        layers.append(InvertedResidual(cin, out, k, s, exp, nn.ReLU if act == "RE" else nn.Hardswish,
                                       SqueezeExcite if se else None))
        cin = out
    layers.append(conv_bn(cin, last, 1, act=nn.Hardswish))
    return Pooled(nn.Sequential(*layers), nn.Sequential(nn.Linear(last, head), nn.Hardswish(),
                                                        nn.Linear(head, classes)))


# ---- EfficientNet-B0 (SiLU, squeeze-excite with sigmoid) --------------------------------------

def efficientnet_b0(classes=1000):
    cfg = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
           (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]  # expand, k, stride, out, repeats
    layers, cin = [conv_bn(3, 32, 3, 2, act=nn.SiLU)], 32
    for t, k, s, c, n in cfg:
        for i in range(n):
            se = (lambda ch, cin=cin: SqueezeExcite(ch, act=nn.SiLU, gate=nn.Sigmoid, squeeze=max(1, cin // 4)))
            layers.append(InvertedResidual(cin, c, k, s if i == 0 else 1, cin * t, nn.SiLU, se))
            cin = c
    layers.append(conv_bn(cin, 1280, 1, act=nn.SiLU))
    return Pooled(nn.Sequential(*layers), nn.Linear(1280, classes))


# ---- ConvNeXt-Tiny (depthwise 7x7, channels-last LayerNorm, GELU, layer scale) ---------------

class ConvNeXtBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pw2(F.gelu(self.pw1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), classes=1000):
        super().__init__()
        layers = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
        for i, (d, c) in enumerate(zip(depths, dims)):
            if i:
                layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], c, 2, 2)]
            layers += [ConvNeXtBlock(c) for _ in range(d)]
        self.features = nn.Sequential(*layers)
        self.norm, self.fc = nn.LayerNorm(dims[-1], eps=1e-6), nn.Linear(dims[-1], classes)

    def forward(self, x):
        return self.fc(self.norm(self.features(x).mean((2, 3))))


# ---- U-Net (ConvTranspose upsampling, skip concatenations) ------------------------------------

class UNet(nn.Module):
    def __init__(self, cin=3, classes=2, base=32, levels=4):
        super().__init__()
        chans = [base * 2 ** i for i in range(levels + 1)]
        self.downs = nn.ModuleList()
        c = cin
        for ch in chans:
            self.downs.append(nn.Sequential(conv_bn(c, ch), conv_bn(ch, ch)))
            c = ch
        self.ups, self.decs = nn.ModuleList(), nn.ModuleList()
        for ch in reversed(chans[:-1]):
            self.ups.append(nn.ConvTranspose2d(ch * 2, ch, 2, 2))
            self.decs.append(nn.Sequential(conv_bn(ch * 2, ch), conv_bn(ch, ch)))
        self.out = nn.Conv2d(chans[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, down in enumerate(self.downs):
            x = down(F.max_pool2d(x, 2) if i else x)
            skips.append(x)
        for up, dec, skip in zip(self.ups, self.decs, reversed(skips[:-1])):
            x = dec(torch.cat([up(x), skip], 1))
        return self.out(x)


# ---- DBNet-style text detector (ResNet-18 backbone, FPN with Resize, sigmoid heads) ----------

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, act=None))
        self.down = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.body(x) + self.down(x))


class DBNet(nn.Module):
    def __init__(self, inner=256):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        chans, stages, cin = [64, 128, 256, 512], nn.ModuleList(), 64
        for i, c in enumerate(chans):
            stages.append(nn.Sequential(BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)))
            cin = c
        self.stages = stages
        self.lateral = nn.ModuleList(nn.Conv2d(c, inner, 1, bias=False) for c in chans)
        self.smooth = nn.ModuleList(nn.Conv2d(inner, inner // 4, 3, padding=1, bias=False) for _ in chans)
        self.head_prob, self.head_thresh = self._head(inner), self._head(inner)

    @staticmethod
    def _head(inner):
        return nn.Sequential(conv_bn(inner, inner // 4), nn.ConvTranspose2d(inner // 4, inner // 4, 2, 2),
                             nn.BatchNorm2d(inner // 4), nn.ReLU(), nn.ConvTranspose2d(inner // 4, 1, 2, 2),
                             nn.Sigmoid())

    def forward(self, x):
        feats, y = [], self.stem(x)
        for stage in self.stages:
            y = stage(y)
            feats.append(y)
        lat = [l(f) for l, f in zip(self.lateral, feats)]
        for i in range(3, 0, -1):   # top-down: nearest upsampling by 2, added
            lat[i - 1] = lat[i - 1] + F.interpolate(lat[i], scale_factor=2.0, mode="nearest")
        size = lat[0].shape[2:]     # every level resized to the 1/4 map's size (a shape-driven Resize)
        outs = [F.interpolate(s(l), size=size, mode="nearest") if i else s(l)
                for i, (s, l) in enumerate(zip(self.smooth, lat))]
        fuse = torch.cat(outs, 1)
        return self.head_prob(fuse), self.head_thresh(fuse)


# ---- YOLO-style detector (CSP blocks, SPPF, PAN neck, per-scale heads) -----------------------

def cbs(cin, cout, k=1, s=1):
    return conv_bn(cin, cout, k, s, act=nn.SiLU)


class C3(nn.Module):
    def __init__(self, cin, cout, n=1, shortcut=True):
        super().__init__()
        mid = cout // 2
        self.a, self.b, self.out = cbs(cin, mid), cbs(cin, mid), cbs(2 * mid, cout)
        self.m = nn.ModuleList(nn.Sequential(cbs(mid, mid), cbs(mid, mid, 3)) for _ in range(n))
        self.shortcut = shortcut

    def forward(self, x):
        a = self.a(x)
        for m in self.m:
            a = a + m(a) if self.shortcut else m(a)
        return self.out(torch.cat([a, self.b(x)], 1))


class SPPF(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a, self.out = cbs(c, c // 2), cbs(c * 2, c)

    def forward(self, x):
        x = self.a(x)
        y1 = F.max_pool2d(x, 5, 1, 2)
        y2 = F.max_pool2d(y1, 5, 1, 2)
        return self.out(torch.cat([x, y1, y2, F.max_pool2d(y2, 5, 1, 2)], 1))


class YoloS(nn.Module):
    """YOLOv5s-shaped: width 0.5, depth 0.33; the head reshapes each scale to
    (batch, anchors*h*w, 5+classes) with sigmoids, concatenated over scales."""

    def __init__(self, classes=80, anchors=3):
        super().__init__()
        self.no, self.na = classes + 5, anchors
        self.b1 = nn.Sequential(cbs(3, 32, 6, 2), cbs(32, 64, 3, 2), C3(64, 64), cbs(64, 128, 3, 2), C3(128, 128, 2))
        self.b2 = nn.Sequential(cbs(128, 256, 3, 2), C3(256, 256, 3))
        self.b3 = nn.Sequential(cbs(256, 512, 3, 2), C3(512, 512), SPPF(512))
        self.lat5, self.c4 = cbs(512, 256), C3(512, 256, shortcut=False)
        self.lat4, self.c3 = cbs(256, 128), C3(256, 128, shortcut=False)
        self.d3, self.n4 = cbs(128, 128, 3, 2), C3(256, 256, shortcut=False)
        self.d4, self.n5 = cbs(256, 256, 3, 2), C3(512, 512, shortcut=False)
        self.heads = nn.ModuleList(nn.Conv2d(c, self.no * anchors, 1) for c in (128, 256, 512))

    def forward(self, x):
        p3 = self.b1(x)
        p4 = self.b2(p3)
        p5 = self.b3(p4)
        t5 = self.lat5(p5)
        t4 = self.lat4(self.c4(torch.cat([F.interpolate(t5, scale_factor=2.0, mode="nearest"), p4], 1)))
        o3 = self.c3(torch.cat([F.interpolate(t4, scale_factor=2.0, mode="nearest"), p3], 1))
        o4 = self.n4(torch.cat([self.d3(o3), t4], 1))
        o5 = self.n5(torch.cat([self.d4(o4), t5], 1))
        outs = []
        for head, o in zip(self.heads, (o3, o4, o5)):
            y = head(o)
            b, _, h, w = y.shape
            y = y.view(b, self.na, self.no, h, w).permute(0, 1, 3, 4, 2).reshape(b, -1, self.no)
            outs.append(y.sigmoid())
        return torch.cat(outs, 1)


# ---- CRNN (conv features + bidirectional LSTM + per-step log-softmax, CTC-style) -------------

class CRNN(nn.Module):
    def __init__(self, classes=37, hidden=128):
        super().__init__()
        self.cnn = nn.Sequential(
            conv_bn(1, 64), nn.MaxPool2d(2, 2), conv_bn(64, 128), nn.MaxPool2d(2, 2),
            conv_bn(128, 256), conv_bn(256, 256), nn.MaxPool2d((2, 1), (2, 1)),
            conv_bn(256, 256), conv_bn(256, 256), nn.MaxPool2d((2, 1), (2, 1)), conv_bn(256, 256))
        self.rnn = nn.LSTM(256 * 2, hidden, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, x):                      # x: (batch, 1, 32, width)
        f = self.cnn(x)                        # (batch, 256, 2, width/4)
        b, c, h, w = f.shape
        f = f.reshape(b, c * h, w).permute(2, 0, 1)   # (time, batch, features)
        y, _ = self.rnn(f)
        return F.log_softmax(self.fc(y), dim=-1)


# ---- 1-D conv audio net (strided Conv1d front end, dilated residual blocks) ------------------

class AudioTCN(nn.Module):
    def __init__(self, classes=35, ch=128):
        super().__init__()
        self.front = nn.Sequential(nn.Conv1d(1, ch, 10, 5, bias=False), nn.BatchNorm1d(ch), nn.ReLU(),
                                   nn.Conv1d(ch, ch, 8, 4, bias=False), nn.BatchNorm1d(ch), nn.ReLU(),
                                   nn.Conv1d(ch, ch, 4, 2, bias=False), nn.BatchNorm1d(ch), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv1d(ch, ch, 3, padding=d, dilation=d, bias=False), nn.BatchNorm1d(ch), nn.ReLU(),
                          nn.Conv1d(ch, ch, 1)) for d in (1, 2, 4, 8, 16, 1, 2, 4))
        self.fc = nn.Linear(ch, classes)

    def forward(self, x):                      # x: (batch, 1, samples)
        x = self.front(x)
        for blk in self.blocks:
            x = F.relu(x + blk(x))
        return self.fc(x.mean(-1))


IMG = (Input("input", ("batch", 3, "height", "width")),)
IMG224 = (Input("input", ("batch", 3, 224, 224)),)

MODELS = [
    Spec("resnet50", "cnn", lambda: ResNet(), IMG224, ({"batch": 1}, {"batch": 4}), {"batch": 2}, opset=17),
    Spec("resnext50_32x4d", "cnn", lambda: ResNet(groups=32, width_per_group=4), IMG224,
         ({"batch": 1}, {"batch": 4}), {"batch": 2}, opset=13),
    Spec("mobilenet_v2", "cnn", mobilenet_v2, IMG,
         ({"batch": 1, "height": 224, "width": 224}, {"batch": 8, "height": 224, "width": 224},
          {"batch": 1, "height": 320, "width": 320}), {"batch": 2, "height": 224, "width": 224}, opset=15),
    Spec("mobilenet_v3_large", "cnn", lambda: mobilenet_v3(MBV3_LARGE, 960, 1280), IMG224,
         ({"batch": 1}, {"batch": 8}), {"batch": 2}, opset=14),
    Spec("mobilenet_v3_small", "cnn", lambda: mobilenet_v3(MBV3_SMALL, 576, 1024), IMG224,
         ({"batch": 1}, {"batch": 8}), {"batch": 2}, exporter="dynamo", opset=18),
    Spec("efficientnet_b0", "cnn", efficientnet_b0, IMG,
         ({"batch": 1, "height": 224, "width": 224}, {"batch": 4, "height": 224, "width": 224},
          {"batch": 1, "height": 256, "width": 256}), {"batch": 2, "height": 224, "width": 224}, opset=16),
    Spec("convnext_tiny", "cnn", lambda: ConvNeXt(depths=(3, 3, 3, 3)), IMG224, ({"batch": 1}, {"batch": 4}),
         {"batch": 2}, opset=17, note="stage-3 depth 3 instead of 9 (same blocks repeated)"),
    Spec("unet", "cnn", UNet, IMG,
         ({"batch": 1, "height": 256, "width": 256}, {"batch": 1, "height": 128, "width": 192}),
         {"batch": 2, "height": 128, "width": 128}, exporter="dynamo", opset=18),
    Spec("dbnet_resnet18", "cnn", DBNet, IMG,
         ({"batch": 1, "height": 320, "width": 320}, {"batch": 1, "height": 480, "width": 640}),
         {"batch": 2, "height": 256, "width": 256}, outputs=("prob", "thresh"), opset=17),
    Spec("yolov5s_style", "cnn", YoloS, IMG,
         ({"batch": 1, "height": 320, "width": 320}, {"batch": 1, "height": 640, "width": 640}),
         {"batch": 2, "height": 256, "width": 256}, opset=13),
    Spec("crnn", "cnn", CRNN, (Input("input", ("batch", 1, 32, "width")),),
         ({"batch": 1, "width": 128}, {"batch": 4, "width": 320}), {"batch": 2, "width": 160}, opset=14),
    Spec("audio_tcn", "cnn", AudioTCN, (Input("input", ("batch", 1, "samples")),),
         ({"batch": 1, "samples": 16000}, {"batch": 8, "samples": 16000}, {"batch": 1, "samples": 64000}),
         {"batch": 2, "samples": 16000}, opset=15),
]
