"""Offline stand-in for @rules_java: re-exports Bazel's native Java rules."""
java_import = native.java_import
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
java_binary = native.java_binary
java_library = native.java_library
