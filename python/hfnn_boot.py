"""The first step of hfnn's start-up hook, at the root of site-packages: hfnn_startup.pth imports it
in every Python process where HFNN_PROFILE_DIR or HFNN_DISPATCH_DB is set, and it imports
hfnn._startup (the profiler's collector, the dispatch table) as soon as torch can be imported.

Usually that is at once. In a virtual environment made with --system-site-packages that has hfnn
but takes torch from the base installation, site processes the environment's .pth files before it
puts the base site-packages on sys.path: torch cannot be imported yet (and neither can the hfnn
package, which imports it). Then the start-up waits for the script's own `import torch` and runs
right after torch's module has run, before the script's next line. Outside the hfnn package on
purpose: importing hfnn needs torch.
"""
import importlib.util
import sys


def _start() -> None:
    import hfnn._startup  # noqa: F401  (installs what the environment asks for)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class _AfterTorch:
    """A meta-path finder that only watches for torch: it hands the import to the other finders and
    runs the start-up once torch's module has run. Removes itself at the first look."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                _start()
            except Exception as e:  # the script's `import torch` must not fail for hfnn's sake
                print(f"hfnn: the start-up hook failed after torch was imported: {type(e).__name__}: {e}; "
                      "this process runs without hfnn's profiler or dispatch", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


if "torch" in sys.modules or _importable("torch"):
    _start()
elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterTorch())
