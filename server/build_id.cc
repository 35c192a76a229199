#include "server/build_id.h"

#include <elf.h>
#include <link.h>

#include <cstring>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "server/cache/encoding.h"

namespace kiln {
namespace {

// dl_iterate_phdr visits the executable first; its PT_NOTE segments hold the GNU build-id.
int FindGnuBuildId(dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<std::string*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      ElfW(Nhdr) note;
      std::memcpy(&note, p, sizeof(note));
      const char* name = p + sizeof(note);
      const char* desc = name + ((note.n_namesz + 3) & ~3u);
      const char* next = desc + ((note.n_descsz + 3) & ~3u);
      if (next > end || next <= p) break;
      if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0 &&
          note.n_descsz > 0) {
        *out = "gnu:" + absl::BytesToHexString(absl::string_view(desc, note.n_descsz));
        return 1;
      }
      p = next;
    }
  }
  return 1;  // only the executable (the first object) counts
}

std::string Compute() {
  std::string id;
  dl_iterate_phdr(FindGnuBuildId, &id);
  if (!id.empty()) return id;
  std::ifstream in("/proc/self/exe", std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  if (size <= 0) return "";
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), size)) return "";
  return "sha256:" + cache::Sha256Hex(bytes);
}

}  // namespace

std::string ProgramBuildId() {
  static const std::string id = Compute();
  return id;
}

}  // namespace kiln
