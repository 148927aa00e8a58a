"""The reference implementations of the optimizers gclab writes itself, run on the parameters and
gradients a test hands over (tests/train/optimizer_test.cpp):

  optimizers.py KIND IN OUT OPTIONS_JSON

KIND: adafactor (transformers.optimization.Adafactor, which AI Toolkit's toolkit/optimizers/adafactor.py
modifies only for low-precision parameters) or prodigy (prodigyopt.Prodigy). IN holds `param.<name>` and
`grad.<step>.<name>`; every step applies the gradients at learning rate `lr`. OUT gets `param.<name>`
after the last step.
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file


def main():
    kind, src, dst, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    t = load_file(src)
    names = sorted(k[len("param."):] for k in t if k.startswith("param."))
    params = {n: torch.nn.Parameter(t["param." + n].clone()) for n in names}  # float32, as gclab trains
    steps = sorted({int(k.split(".")[1]) for k in t if k.startswith("grad.")})
    lr = options.pop("lr")
    if kind == "adafactor":
        from transformers.optimization import Adafactor
        opt = Adafactor(list(params.values()), lr=lr, relative_step=False, warmup_init=False, **options)
    elif kind == "prodigy":
        from prodigyopt import Prodigy
        opt = Prodigy(list(params.values()), lr=lr, **options)
    else:
        raise SystemExit(f"unknown optimizer {kind}")
    for s in steps:
        for n, p in params.items():
            p.grad = t[f"grad.{s}.{n}"].clone()
        opt.step()
    save_file({"param." + n: p.detach().float().contiguous() for n, p in params.items()}, dst)


if __name__ == "__main__":
    main()
