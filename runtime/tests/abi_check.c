/* Compiled as C against kiln_runtime.h by build_sh_test: the header is valid C and the library
 * refuses bad input with error codes instead of crashing. */
#include <stdio.h>
#include <string.h>

#include "kiln_cuda.h"
#include "kiln_runtime.h"

int main(void) {
  kiln_module* m = 0;
  const char junk[100] = "not an elf";
  char elf_prefix[100];
  memset(elf_prefix, 0, sizeof(elf_prefix));
  memcpy(elf_prefix, "\x7f" "ELF", 4);
  if (kiln_runtime_abi_version() != KILN_RUNTIME_ABI_VERSION) return 1;
  if (kiln_module_load(0, 0, &m) != KILN_ERROR_INVALID_ARGUMENT) return 2;
  if (strlen(kiln_last_error()) == 0) return 3;
  if (kiln_module_load(junk, sizeof(junk), &m) != KILN_ERROR_LOAD || m != 0) return 4;
  if (kiln_module_load(elf_prefix, sizeof(elf_prefix), &m) != KILN_ERROR_LOAD || m != 0) return 5;
  if (kiln_run_steps(0, 0, 0) != KILN_ERROR_INVALID_ARGUMENT) return 6;
  if (kiln_module_unload(0) != KILN_OK) return 7;
  /* The CUDA half: bad input is refused before the driver is needed; without the driver
   * (KILN_LIBCUDA_PATH points nowhere) a load says so. */
  kiln_cuda_module* cm = 0;
  int version = 0;
  if (kiln_cuda_module_load(0, 0, 0, &cm) != KILN_ERROR_INVALID_ARGUMENT) return 8;
  if (kiln_cuda_module_load(junk, sizeof(junk), 0, &cm) != KILN_ERROR_LOAD || cm != 0) return 9;
  if (kiln_cuda_init() != KILN_ERROR_UNAVAILABLE) return 10;
  if (strstr(kiln_cuda_last_error(), "libcuda") == 0) return 11;
  if (kiln_cuda_driver_version(&version) != KILN_ERROR_UNAVAILABLE) return 12;
  if (kiln_cuda_run_launches(0, 0, 0, 0) != KILN_ERROR_INVALID_ARGUMENT) return 13;
  if (kiln_cuda_module_unload(0) != KILN_OK) return 14;
  printf("abi ok\n");
  return 0;
}
