"""The training loop the module-family dispatch scripts (mha_train.py, lstm_train.py) share: the
model built with seed 0 on the device (hfnn.to_hfnn'd in mode "to_hfnn"), inputs and a target drawn
on the CPU from seed 1 (the same data on every device), AdamW on the mean squared error; then one
JSON line with the losses, hfnn.dispatch_stats() and what the script adds about its family."""
import json

import torch


def train_and_report(make_model, device: str, steps: int, mode: str, input_shapes, target_shape, report) -> None:
    torch.manual_seed(0)
    model = make_model().to(device)
    if mode == "to_hfnn":
        import hfnn

        model = hfnn.to_hfnn(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(*shape, generator=g).to(device) for shape in input_shapes]
    target = torch.randn(*target_shape, generator=g).to(device)
    losses = []
    for _ in range(steps):
        loss = (model(*inputs) - target).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())

    import hfnn

    print(json.dumps({"losses": losses, "stats": hfnn.dispatch_stats(), **report(hfnn)}))
