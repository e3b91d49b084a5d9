"""The harness hfnn's example training scripts share: their common options, the device and size
they run on, hfnn.to_hfnn when asked for, and the timed training loop with its printed lines and
JSON file. Each script keeps its model, sizes, data, loss and own options, and imports this module
from its own directory (the scripts are run by path, from any working directory).

Plain PyTorch like the scripts: hfnn is imported only with --hfnn.

Under torchrun (WORLD_SIZE > 1) the scripts train data-parallel: one process group (NCCL on CUDA,
gloo on the CPU), each rank on the GPU of its LOCAL_RANK, the model wrapped in
DistributedDataParallel, every rank on the same data; rank 0 prints and writes --json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any, Callable

import torch
from torch import nn

LAYERNORM_HFNN_HELP = "run every nn.LayerNorm through hfnn (hfnn.to_hfnn(model))"


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def world() -> tuple[int, int]:
    """(rank, world size) from torchrun's variables; (0, 1) when run directly."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def start(script: str, description: str, size_help: str,
          options: Callable[[argparse.ArgumentParser], Any] | None = None,
          size_options: Callable[[argparse.ArgumentParser], Any] | None = None,
          hfnn_help: str = LAYERNORM_HFNN_HELP) -> tuple[argparse.Namespace, torch.device, str]:
    """Parses the command line, resolves --device and --size and seeds torch with --seed.

    script is the calling script's __file__: it names the script in the epilog's example and in
    the one-line `error:` messages. options adds the script's own options (listed after --warmup),
    size_options those that refine --size (listed right after it); size_help describes the full and
    small sizes. Returns (args, device, size) with size "full" or "small"; exits 2 with a one-line
    error for --device cuda without CUDA, and for --dtype bfloat16 off CUDA.
    """
    name = os.path.basename(script)
    p = argparse.ArgumentParser(
        description=description,
        epilog=f"Example: python3 examples/{name} --hfnn --steps 20 --json /tmp/{os.path.splitext(name)[0]}.json",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hfnn", action="store_true", help=hfnn_help)
    p.add_argument("--steps", type=positive, default=10, help="timed training steps")
    p.add_argument("--warmup", type=non_negative, default=3, help="untimed steps before the timed ones")
    if options:
        options(p)
    p.add_argument("--size", choices=["full", "small", "auto"], default="auto",
                   help=f"{size_help}; auto: full on CUDA, small on CPU")
    if size_options:
        size_options(p)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16 runs under torch.autocast, CUDA only")
    p.add_argument("--tf32", action="store_true",
                   help="float32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32): torch's default "
                        "before 1.12, and how the seeds' AlphaFold profile ran (its GEMMs are TF32 kernels)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="auto: CUDA when available")
    p.add_argument("--seed", type=int, default=0, help="seeds the parameters and the data")
    p.add_argument("--json", metavar="PATH", help="also write the step times and losses to this JSON file")
    args = p.parse_args()

    def fail(message: str) -> None:
        print(f"{name}: error: {message}", file=sys.stderr)
        sys.exit(2)

    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but CUDA is not available to this torch")
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if args.dtype == "bfloat16" and device.type != "cuda":
        fail("--dtype bfloat16 needs CUDA; on the CPU use --dtype float32")
    size = args.size if args.size != "auto" else ("full" if device.type == "cuda" else "small")
    if world()[1] > 1:
        import torch.distributed as dist
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.manual_seed(args.seed)
    return args, device, size


def layernorm_note(hfnn: Any, model: nn.Module, device: torch.device) -> str:
    """How many LayerNorms to_hfnn swapped, and whose kernels they run."""
    if device.type != "cuda":
        kernels = "torch's kernels on the CPU"
    elif not hfnn.build_info().get("cuda_kernels"):
        kernels = "torch's kernels: " + (hfnn.ops_error() or "this hfnn build has no CUDA kernels")
    else:
        kernels = "hfnn's CUDA kernels"
    return f"{sum(isinstance(x, hfnn.nn.LayerNorm) for x in model.modules())} LayerNorms, {kernels}"


def apply_hfnn(model: nn.Module, enabled: bool, device: torch.device,
               note: Callable[[Any, nn.Module, torch.device], str] = layernorm_note) -> tuple[nn.Module, str]:
    """hfnn.to_hfnn(model) when enabled; returns the model and the header's hfnn note ("off", or
    "on, " and what note(hfnn, model, device) says of the converted model)."""
    text = "off"
    if enabled:
        import hfnn  # only with --hfnn: without it the examples are plain PyTorch scripts
        model = hfnn.to_hfnn(model)
        text = f"on, {note(hfnn, model, device)}"
    if world()[1] > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    return model, text


def print_header(device: torch.device, size: str, cfg: Any, depth: str, model: nn.Module, dtype: str,
                 hfnn_note: str) -> None:
    """The first line: device, size and its config (a dataclass), depth ("blocks 2", "layers 1"),
    parameter count, dtype and the hfnn note."""
    params = sum(p.numel() for p in model.parameters())
    rank, world_size = world()
    if rank != 0:
        return
    ranks = f", {world_size} ranks (DDP)" if world_size > 1 else ""
    tf32 = "+tf32" if torch.backends.cuda.matmul.allow_tf32 else ""
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"size {size} {asdict(cfg)}, {depth}, {params / 1e6:.2f}M parameters, dtype {dtype}{tf32}, "
          f"hfnn {hfnn_note}{ranks}")


def train(model: nn.Module, args: argparse.Namespace, device: torch.device, size: str,
          forward: Callable[[], torch.Tensor], loss_fn: Callable[[torch.Tensor], torch.Tensor],
          json_fields: dict[str, Any] | None = None) -> None:
    """--warmup untimed and --steps timed AdamW steps: forward() under autocast (bfloat16 with
    --dtype bfloat16), loss_fn(output) outside it, backward, step. Prints a line a step and the
    median; with --json writes the step times and losses, then json_fields. Under torchrun only
    rank 0 prints and writes, and the process group is closed at the end."""
    rank, world_size = world()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def sync() -> None:  # CUDA runs asynchronously: wait for the step before reading the clock
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step_ms, losses = [], []
    for step in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            output = forward()
        loss = loss_fn(output)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        ms = (time.perf_counter() - start) * 1e3
        value = loss.item()
        timed = step >= args.warmup
        if timed:
            step_ms.append(ms)
            losses.append(value)
        label = f"step {step - args.warmup + 1}/{args.steps}" if timed else f"warmup {step + 1}/{args.warmup}"
        if rank == 0:
            print(f"{label:>14}  loss {value:.4f}  {ms:9.2f} ms")

    median = statistics.median(step_ms)
    if world_size > 1:
        import torch.distributed as dist
        dist.destroy_process_group()
    if rank != 0:
        return
    print(f"median step {median:.2f} ms over {args.steps} steps ({device.type}, {size}, {args.dtype}, "
          f"hfnn {'on' if args.hfnn else 'off'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "step_ms": step_ms, "median_step_ms": median, "loss": losses,
                       "device": str(device), "size": size, "hfnn": args.hfnn, "world_size": world_size, **(json_fields or {})}, f, indent=2)
