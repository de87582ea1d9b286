"""The UCX tests, each run twice: over what UCX finds on this host, and
over TCP only."""

load("//bazel:tessera.bzl", "tessera_cc_test")

# UCX over TCP only, as between hosts on a trusted fabric.
UCX_TCP_ONLY_ENV = {
    "TESSERA_TRUSTED_FABRIC": "1",
    "UCX_TLS": "tcp",
}

def ucx_cc_test(name, deps):
    """NAME.cc over whatever transports UCX picks here (shared memory, CMA),
    and again over TCP only as NAME with `_tcp_test` for its `_test`."""
    tessera_cc_test(name = name, deps = deps)
    tessera_cc_test(
        name = name[:-len("_test")] + "_tcp_test",
        srcs = [name + ".cc"],
        env = UCX_TCP_ONLY_ENV,
        deps = deps,
    )
