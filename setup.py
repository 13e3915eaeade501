"""Build hook: generate the gRPC/protobuf modules from proto/ into src/persys/_pb.

The generated code is never committed; it is produced whenever the package is built
(wheel, sdist install or editable install).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "src"
# Generated modules live under persys._pb.<path of the proto>, so imports between them resolve.
PREFIX = Path("persys") / "_pb"


def generate() -> None:
    from grpc_tools import protoc  # build requirement

    import grpc_tools

    protos = sorted(PROTO_DIR.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        for src in protos:
            rel = src.relative_to(PROTO_DIR)
            dst = staged / PREFIX / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text()
            # Imports inside our protos are written relative to proto/; re-root them.
            for other in protos:
                orel = other.relative_to(PROTO_DIR).as_posix()
                text = text.replace(f'import "{orel}";', f'import "{(PREFIX / orel).as_posix()}";')
            dst.write_text(text)
        well_known = Path(grpc_tools.__file__).parent / "_proto"
        files = [str((PREFIX / p.relative_to(PROTO_DIR)).as_posix()) for p in protos]
        args = [
            "protoc",
            f"-I{staged}",
            f"-I{well_known}",
            f"--python_out={OUT_DIR}",
            f"--grpc_python_out={OUT_DIR}",
            f"--pyi_out={OUT_DIR}",
            *files,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
    # Every generated directory must be a package.
    for d in (OUT_DIR / PREFIX).rglob("*"):
        if d.is_dir() and not (d / "__init__.py").exists():
            (d / "__init__.py").write_text("")


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        generate()
        super().run()


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithProtos})
