"""Build hook: ships the kiln runtime library's sources (the repository's runtime/) inside the
package as kiln/_runtime/runtime/, so that kiln.runtime can build libkiln_runtime.so with
runtime/build.sh at first use on machines without the repository. All other metadata is in
pyproject.toml. An editable install needs no copy: kiln.runtime finds the checkout's runtime/."""

import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
RUNTIME = HERE.parents[1] / "runtime"


class build_py_with_runtime(build_py):
    def run(self):
        super().run()
        if not (RUNTIME / "build.sh").is_file():
            return  # building from an sdist that already carries kiln/_runtime, or no runtime yet
        out = pathlib.Path(self.build_lib) / "kiln" / "_runtime" / "runtime"
        out.mkdir(parents=True, exist_ok=True)
        for path in RUNTIME.iterdir():
            if path.is_file() and (path.suffix in (".cc", ".h") or path.name == "build.sh"):
                shutil.copy2(path, out / path.name)


setup(cmdclass={"build_py": build_py_with_runtime})
