import pytest
import torch

import hfnn


def pytest_report_header(config):
    info = hfnn.build_info()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return [f"hfnn {hfnn.__version__}: CUDA kernels {info['cuda_kernels']} ({info['cuda_architectures'] or '-'}), "
            f"torch {torch.__version__}, GPU {gpu}"]


# GPU tests say why they skip: CI has no GPU; the device machine runs them (scripts/device_run.sh).
def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device: GPU tests run on the GPU machine (scripts/device_run.sh)"
    if not hfnn.build_info()["cuda_kernels"]:
        return "this hfnn build has no CUDA kernels (built without nvcc)"
    return None


requires_gpu = pytest.mark.skipif(_gpu_skip_reason() is not None, reason=_gpu_skip_reason() or "")
