"""The small CNN for the digits images learns them."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gvq import data as D
from gvq import models as M


def test_digits_cnn_learns(one_thread):
    torch.manual_seed(0)
    d, model = D.digits(), M.DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    iters = 200
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * i / iters)))
    batches = D.iterate_batches(d, 0, 1, 64, seed=0)
    for _ in range(iters):
        _, x, y = next(batches)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        acc = (model(d.x_test).argmax(1) == d.y_test).float().mean().item()
    assert acc >= 0.93, acc
