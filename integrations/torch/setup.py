"""pip install ./integrations/torch: braid_torch for the torch of the
interpreter that runs pip (a torch from pip, say), without CMake.

braid's host sources are compiled into the extension module with torch's
own compiler flags, so the module uses torch's C++ ABI throughout
(_GLIBCXX_USE_CXX11_ABI may differ from the system's, as in some torch
wheels) and needs no libbraid.so beside it. Device support (CUDA) is not
built this way: the CMake build has it.

    python3 -m pip install --no-build-isolation ./integrations/torch
"""
import pathlib
import re

import torch
from setuptools import setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
GENERATED = HERE / "build" / "generated"


def braid_version():
    found = re.search(r"project\(braid VERSION (\d+)\.(\d+)\.(\d+)", (ROOT / "CMakeLists.txt").read_text())
    return tuple(int(part) for part in found.groups())


def write_version_header(version):
    """What CMake makes of include/braid/version.h.in."""
    text = (ROOT / "include" / "braid" / "version.h.in").read_text()
    for name, value in zip(("MAJOR", "MINOR", "PATCH"), version):
        text = text.replace(f"@PROJECT_VERSION_{name}@", str(value))
    text = text.replace("@PROJECT_VERSION@", ".".join(map(str, version)))
    header = GENERATED / "braid" / "version.h"
    header.parent.mkdir(parents=True, exist_ok=True)
    if not header.exists() or header.read_text() != text:
        header.write_text(text)


# Transports that need a library this build leaves out (BRAID_HAVE_UCX and
# BRAID_HAVE_IBVERBS are 0 below; the transport table then names them as
# not built).
LEFT_OUT_TRANSPORTS = {"ucx", "ibverbs"}


def braid_sources():
    """libbraid's host sources, as the top-level CMakeLists.txt finds them:
    src/, the transport table and wiring, and every transport folder."""
    patterns = ["src/core/*.cc", "src/bootstrap/*.cc", "src/algorithms/*.cc", "src/exec/*.cc",
                "src/reduce/*.cc", "src/tuning/*.cc", "src/ddp/*.cc", "src/device/*.cc",
                "src/device/emulated/*.cc", "transports/*.cc"]
    patterns += [f"transports/{folder.name}/*.cc"
                 for folder in sorted((ROOT / "transports").iterdir())
                 if (folder / "CMakeLists.txt").exists() and folder.name not in LEFT_OUT_TRANSPORTS]
    return sorted(str(path) for pattern in patterns for path in ROOT.glob(pattern))


class BuildPy(build_py):
    """Also writes braid_torch/_built_for.py: the torch this build is for,
    which the package checks before it loads the extension."""

    def run(self):
        super().run()
        target = pathlib.Path(self.build_lib) / "braid_torch" / "_built_for.py"
        target.write_text(f'TORCH_VERSION = "{torch.__version__}"\n')


version = braid_version()
write_version_header(version)
setup(
    name="braid-torch",
    version=".".join(map(str, version)),
    description='torch.distributed backend "braid"',
    packages=["braid_torch"],
    ext_modules=[
        CppExtension(
            "braid_torch._C",
            [str(HERE / "csrc" / "module.cc"), str(HERE / "csrc" / "process_group.cc")] + braid_sources(),
            include_dirs=[str(ROOT / "include"), str(GENERATED), str(ROOT / "src"), str(ROOT)],
            define_macros=[("BRAID_HAVE_CUDA", "0"), ("BRAID_HAVE_UCX", "0"), ("BRAID_HAVE_IBVERBS", "0"),
                           ("BRAID_HAVE_TLS", "0")],  # (no OpenSSL linked: sockets stay plain)
            extra_compile_args=["-O3", "-fno-semantic-interposition", "-Wno-unused-parameter"],
            libraries=["pthread"],
        )
    ],
    cmdclass={"build_ext": BuildExtension, "build_py": BuildPy},
    python_requires=">=3.8",
)
