"""Start-up hook for `hfnn profile`: imported by hfnn_startup.pth in every Python process, but
only when HFNN_PROFILE_DIR is set (the .pth checks the variable before importing anything), so
it does nothing at all otherwise.

It starts hfnn's in-process collector (profiles/collector.cpp), passes it what the database
records about the run, and makes sure the part is written however the script ends: normal exit,
an exception, Ctrl-C or SIGTERM (each step also rewrites it, so even a crash leaves the steps
finished before it).
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import sys


def _meta() -> dict:
    import torch

    from . import __version__

    meta = {
        "argv": sys.argv,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "rank": int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "torch": torch.__version__,
        "hfnn": __version__,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        meta["gpu"] = {"name": props.name, "cc": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count}
    return meta


def _install() -> None:
    directory = os.environ["HFNN_PROFILE_DIR"]
    import torch

    from . import _ops

    if not _ops.available:
        print(f"hfnn profile: {_ops.ops_error()}; this process is not profiled", file=sys.stderr)
        return
    config = {
        "dir": directory,
        "warmup": int(os.environ.get("HFNN_PROFILE_WARMUP", "0")),
        "steps": int(os.environ.get("HFNN_PROFILE_STEPS", "0")),
        "meta": _meta(),
    }
    torch.ops.hfnn.profiler_start(json.dumps(config))
    atexit.register(torch.ops.hfnn.profiler_stop)

    # SIGTERM would end the process without atexit; turn it into SystemExit so the part is written.
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


_install()
