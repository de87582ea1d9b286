"""Shared build macros: one place for copts and the protoc/gRPC codegen."""

TESSERA_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-sign-compare",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
]

# Test code (test bodies and testonly scaffolding) is built for the
# compile, not the run: it mostly waits on daemons built -O2, and -Og
# compiles a test file in half the time or less (cli_test.cc: 24 s -> 11 s),
# a large part of a cold build of the test command.
TEST_COPTS = ["-Og"]

# A library is NAME.cc and NAME.h by default, each where it exists (a
# header-only library has no NAME.cc; one that only gathers deps has neither).
def tessera_cc_library(name, copts = [], srcs = None, hdrs = None, **kwargs):
    native.cc_library(
        name = name,
        srcs = srcs if srcs != None else native.glob([name + ".cc"]),
        hdrs = hdrs if hdrs != None else native.glob([name + ".h"]),
        copts = TESSERA_COPTS + (TEST_COPTS if kwargs.get("testonly") else []) + copts,
        **kwargs
    )

# A library built on CUDA. Its sources find CUDA's headers through copts,
# which do not spread to its dependents: a --config=cuda build then
# recompiles only the sources that use CUDA, not every test linking the
# worker or the SDK (an include path on @cuda would change every dependent's
# command line).
CUDA_COPTS = [
    "-isystem",
    "external/cuda/include",
    "-isystem",
    "external/cuda/include/cccl",
]

def tessera_cuda_library(name, copts = [], deps = [], **kwargs):
    tessera_cc_library(
        name = name,
        copts = CUDA_COPTS + copts,
        deps = deps + ["//third_party:cuda_headers"],
        **kwargs
    )

def tessera_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = TESSERA_COPTS + copts, **kwargs)

STATUS_MATCHERS = "//core/testing:status_matchers"

def _absolute(label):
    """LABEL as written from another package (":x" names this package's x)."""
    if label.startswith(":"):
        return "//" + native.package_name() + label
    return label

# Every test uses the status matchers, and a test is one NAME.cc by default.
# (status_matchers depends only on //third_party, which has no tests: no cycle.)
def tessera_cc_test(name, copts = [], deps = [], srcs = None, **kwargs):
    extra = []
    if STATUS_MATCHERS not in [_absolute(d) for d in deps]:
        extra = [STATUS_MATCHERS]
    native.cc_test(
        name = name,
        srcs = srcs if srcs != None else [name + ".cc"],
        copts = TESSERA_COPTS + TEST_COPTS + copts,
        deps = deps + extra + ["//third_party:gtest_main"],
        **kwargs
    )

def tessera_proto_library(name, src, deps = [], grpc = False, visibility = None):
    """Compiles one .proto with Debian's protoc (and grpc_cpp_plugin when grpc=True)."""
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    proto_srcs = [d + "_srcs" for d in deps]
    grpc_flags = ""
    if grpc:
        grpc_flags = " --grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(which grpc_cpp_plugin)"
    native.filegroup(name = name + "_srcs", srcs = [src], visibility = visibility)
    native.genrule(
        name = name + "_gen",
        srcs = [src] + proto_srcs,
        outs = outs,
        cmd = "protoc -I. --cpp_out=$(GENDIR)" + grpc_flags + " $(location " + src + ")",
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
    )

# What both daemon libraries (coordinator_daemon, worker_daemon) build on:
# a daemon's life, listener, TLS and credential reloading, metrics port and
# process metrics (ops/), and gRPC serving (rpc/).
DAEMON_DEPS = [
    "//ops:daemon_life",
    "//core",
    "//core:metrics",
    "//ops:credential_watch",
    "//ops:daemon_listener",
    "//ops:daemon_security",
    "//ops:metrics_http",
    "//ops:process_metrics",
    "//rpc:channel",
    "//rpc:security",
    "//rpc:server",
    "//third_party:absl",
    "//third_party:spdlog",
]

# What every end-to-end test of tests/ links: a real cluster of daemon
# processes (tests/cluster.h), test arrays, the SDK and core (tessera_cc_test
# adds the matchers).
CLUSTER_TEST_DEPS = [
    "//tests:cluster",
    "//tests:test_arrays",
    "//client:sdk",
    "//core",
    "//third_party:absl",
]

CLUSTER_TEST_DAEMONS = [
    "//coordinator:tessera-coordinator",
    "//worker:tessera-worker",
]

def tessera_cluster_test(name, deps = [], data = [], size = "large", **kwargs):
    """An end-to-end test in NAME.cc against real daemons on 127.0.0.1."""
    tessera_cc_test(
        name = name,
        size = size,
        data = CLUSTER_TEST_DAEMONS + data,
        deps = CLUSTER_TEST_DEPS + [d for d in deps if d not in CLUSTER_TEST_DEPS],
        **kwargs
    )
