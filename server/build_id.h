#ifndef KILN_SERVER_BUILD_ID_H_
#define KILN_SERVER_BUILD_ID_H_

// The identity of this kilnd build, for the cache key (component "kilnd_build") and --version.
// kilnd's own code generates what it caches, and kiln's version string does not change with every
// build, so a rebuilt kilnd must not serve entries another build made.
//
// ProgramBuildId(): "gnu:" + the hex GNU build-id note of the running executable (the linker's
// hash of its contents; read from memory, no file access), else "sha256:" + the SHA-256 of
// /proc/self/exe read in one go, else "" (neither available). Computed once per process.
#include <string>

namespace kiln {

std::string ProgramBuildId();

}  // namespace kiln

#endif  // KILN_SERVER_BUILD_ID_H_
