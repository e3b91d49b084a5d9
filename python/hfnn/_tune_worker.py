"""The measuring half of `hfnn tune`: started by the hfnn executable, never by users.

It speaks JSON lines. First it prints {"hello": {...}} (the GPU and the versions the results are
keyed by) or {"error": "..."} and exits 3 when there is nothing to tune on. Then for each request
line, {"op": "layer_norm", "key": "rows=R,D=C,affine=1", "dtype": "float32", "passes": ["fwd", "bwd"],
"seconds": 2.0}, it prints one line with every candidate's timing samples and its error against a
float64 reference: {"key", "dtype", "candidates": [{"pass", "name", "samples_us", "max_error"} or
{"pass", "name", "ran": false, "error"}], "seconds"}. The executable gates, picks and stores
(tuner/tuner.h); this file only measures, through the op's family module (hfnn/_families/).

How: each candidate runs as one CUDA graph of back-to-back calls over rotating input sets three
times the size of L2 (the cache flatters nothing, CPU dispatch is out of the number, launch gaps
are those of a training step); samples are per-call times of repeated replays (hfnn/_measure.py).
The error is max|out - ref| / max|ref| over each output of the pass, on fresh inputs, against
torch's float64 result.

HFNN_TUNE_PLANT_WRONG=1 adds a fast candidate that is wrong on purpose ("planted_wrong"): the gate
must reject it.
"""
from __future__ import annotations

import json
import os
import sys

from . import _families
from ._measure import first_line


# The protocol's own copy of stdout: main() points fd 1 at stderr, so whatever a library prints
# cannot fall between two answers.
_protocol = sys.stdout


def emit(obj) -> None:
    _protocol.write(json.dumps(obj) + "\n")
    _protocol.flush()


def hello(torch, hfnn, device: int) -> dict:
    props = torch.cuda.get_device_properties(device)
    return {"gpu": props.name, "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count, "cuda": torch.version.cuda or "", "torch": torch.__version__,
            "hfnn": hfnn.__version__, "l2_bytes": props.L2_cache_size}


def main() -> int:
    global _protocol
    _protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    device = int(os.environ.get("HFNN_TUNE_DEVICE", "0"))
    try:
        import torch
        import hfnn
    except Exception as e:
        emit({"error": f"cannot import torch and hfnn in {sys.executable}: {e}"})
        return 3
    if not torch.cuda.is_available():
        emit({"error": "no CUDA device visible to torch: tuning measures kernels on the GPU they will run on"})
        return 3
    if device >= torch.cuda.device_count():
        emit({"error": f"--device {device}, but this machine has {torch.cuda.device_count()} CUDA device(s)"})
        return 3
    if not hfnn.build_info().get("cuda_kernels"):
        emit({"error": f"this hfnn build has no CUDA kernels ({hfnn.ops_error() or 'built without nvcc'}): "
                       "reinstall with the CUDA toolkit present"})
        return 3
    torch.cuda.set_device(device)
    info = hello(torch, hfnn, device)
    emit({"hello": info})
    plant = os.environ.get("HFNN_TUNE_PLANT_WRONG") == "1"
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            family = _families.find(req.get("op"))
            if family is None or not hasattr(family, "measure"):
                raise ValueError(f"no hfnn variants to tune for {req.get('op')} yet")
            emit(family.measure(torch, hfnn, req, info["l2_bytes"], plant))
        except Exception as e:
            emit({"key": req.get("key"), "dtype": req.get("dtype"), "op": req.get("op"), "error": first_line(e)})
        try:
            torch.cuda.empty_cache()
        except Exception:
            pass
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: hfnn tune keeps what is done
        sys.exit(130)
