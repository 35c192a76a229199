"""embed_headers: helper headers -> one C++ string constant, so generated sources need no includes."""

def embed_headers(name, srcs, package, function):
    """Writes embedded_headers.cc defining `const char* kiln::kernels::<function>()`.

    Concatenates `srcs` in order into one raw string literal, dropping their `#include "..."` lines
    (the included headers come earlier in the same string). A header must not contain
    `)kiln_embed"`; the rule fails if one does.
    """
    native.genrule(
        name = name,
        srcs = srcs,
        outs = ["embedded_headers.cc"],
        cmd = """
set -e
out=$@
{
  echo '// Generated from %s/*.h by //%s:%s. Do not edit.'
  echo '#include "%s/embedded_headers.h"'
  echo 'namespace kiln::kernels {'
  echo 'const char* %s() {'
  echo '  static const char* const kText = R"kiln_embed('
  for f in $(SRCS); do
    echo "// ---- %s/$$(basename $$f)"
    grep -v '^#include "' $$f
  done
  echo ')kiln_embed";'
  echo '  return kText;'
  echo '}'
  echo '}  // namespace kiln::kernels'
} > $$out
if grep -q ')kiln_embed"' $(SRCS); then echo "a header contains the delimiter" >&2; exit 1; fi
""" % (package, package, name, package, function, package),
    )
