"""cuda_library: compiles .cu files with nvcc and wraps the objects in a cc_library.

This macro is the one place that owns nvcc flags. Each .cu file becomes its own genrule so
Bazel compiles translation units in parallel (one kernel instantiation per file).
"""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "--use_fast_math",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wall",
    "--expt-relaxed-constexpr",
    "-DFMT_HEADER_ONLY",
    "-DSPDLOG_HEADER_ONLY",
    "-DSPDLOG_FMT_EXTERNAL",
]

def cuda_library(name, srcs, hdrs = [], deps = [], cuda_hdrs = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc.

    Args:
      name: target name.
      srcs: .cu files (and optionally .cc files compiled by the host compiler).
      hdrs: public headers.
      deps: cc_library dependencies (their headers are visible to nvcc through -I.).
      cuda_hdrs: extra headers the .cu files include (private to this library).
      copts: extra nvcc flags.
      visibility: Bazel visibility.
      **kwargs: passed to the cc_library.
    """
    objs = []
    cc_srcs = []
    for src in srcs:
        if not src.endswith(".cu"):
            cc_srcs.append(src)
            continue
        stem = src[:-3].replace("/", "_")
        obj = "_objs_cu/%s/%s.pic.o" % (name, stem)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + cuda_hdrs,
            outs = [obj],
            cmd = " ".join([NVCC] + NVCC_FLAGS + copts + [
                "-I.",
                "-I$(GENDIR)",
                "-c $(location %s)" % src,
                "-o $@",
            ]),
            tags = ["no-sandbox"],
            visibility = ["//visibility:private"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs + cc_srcs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        visibility = visibility,
        **kwargs
    )
