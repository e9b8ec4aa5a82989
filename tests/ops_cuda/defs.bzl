"""gpu_test: a GoogleTest cc_test of a CUDA op against the CPU reference, tagged "gpu"."""

def gpu_test(name, deps = [], size = "small"):
    native.cc_test(
        name = name,
        size = size,
        srcs = [name + ".cc"],
        tags = ["gpu"],
        deps = deps + [
            ":test_util",
            "//ops/cpu",
            "//third_party:gtest_main",
        ],
    )
