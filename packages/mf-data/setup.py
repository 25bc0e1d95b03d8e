"""Only the C extension lives here; everything else is in pyproject.toml.

`mf_data._chelpers` holds the index-building loops (sample index, blending indices). It is
optional: when it cannot be compiled (no C compiler), the install still succeeds and mf_data uses
its exact numpy versions (`mf_data.helpers.BACKEND` says which one runs).
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """Compiler flags per compiler family: floating-point contraction must stay off (a fused
    multiply-subtract would round the blending error differently from Megatron's)."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "msvc":
            flags = ["/O2", "/fp:precise"]
        else:
            flags = ["-O2", "-ffp-contract=off", "-fno-fast-math"]
        for ext in self.extensions:
            ext.extra_compile_args = flags
        super().build_extensions()


setup(
    ext_modules=[Extension("mf_data._chelpers", ["src/mf_data/_chelpers.c"], optional=True)],
    cmdclass={"build_ext": BuildExt},
)
