"""A few-line torch model for `kiln bench examples/torch_mlp.py --against torch,inductor`."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).eval()
example_inputs = (torch.randn(8, 64),)
