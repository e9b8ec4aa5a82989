"""cc_proto_lite: a .proto compiled by Debian's protoc into a cc_library (protobuf-lite runtime).

The generated foo.pb.h / foo.pb.cc sit beside the .proto in the output tree, so sources include
"<package>/foo.pb.h". The .proto must say `option optimize_for = LITE_RUNTIME;` (the runtime
linked is libprotobuf-lite.a, third_party:protobuf_lite).
"""

PROTOC = "/usr/bin/protoc"

def cc_proto_lite(name, src, visibility = None):
    """A cc_library of the C++ code protoc generates for `src`.

    Args:
      name: target name.
      src: the .proto file (in this package).
      visibility: Bazel visibility.
    """
    stem = src[:-len(".proto")]
    native.genrule(
        name = name + "_protoc",
        srcs = [src],
        outs = [stem + ".pb.h", stem + ".pb.cc"],
        cmd = "%s --proto_path=. --cpp_out=$(GENDIR) $(location %s)" % (PROTOC, src),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [stem + ".pb.cc"],
        hdrs = [stem + ".pb.h"],
        deps = ["//third_party:protobuf_lite"],
        visibility = visibility,
    )
