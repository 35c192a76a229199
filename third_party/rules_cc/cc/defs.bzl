"""Offline stand-in for rules_cc: Bazel 4's native C++ rules, re-exported.

Debian's bazel-bootstrap 4.2.3 would otherwise fetch rules_cc from the internet on first use.
"""

def cc_library(**kw):
    native.cc_library(**kw)

def cc_binary(**kw):
    native.cc_binary(**kw)

def cc_test(**kw):
    native.cc_test(**kw)

def cc_toolchain(**kw):
    native.cc_toolchain(**kw)

def cc_toolchain_suite(**kw):
    native.cc_toolchain_suite(**kw)
