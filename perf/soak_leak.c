// A check that perf/soak.sh catches real leaks in mptrain (docs/reliability.md, "Soak"): preloaded,
// every HDF5 file creation (each checkpoint write, on rank 0) also leaks SOAK_LEAK_KB KiB of
// touched heap (SOAK_LEAK=rss, default 64) or one open descriptor (SOAK_LEAK=fd).
//   gcc -O1 -shared -fPIC -o /tmp/soak_leak.so perf/soak_leak.c -ldl
//   SOAK_LEAK=rss SOAK_LEAK_KB=64 LD_PRELOAD=/tmp/soak_leak.so perf/soak.sh --steps 6000  # must FAIL
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef int64_t hid_t;
hid_t H5Fcreate(const char* name, unsigned flags, hid_t create, hid_t access) {
  static hid_t (*real)(const char*, unsigned, hid_t, hid_t);
  if (!real) real = (hid_t(*)(const char*, unsigned, hid_t, hid_t))dlsym(RTLD_NEXT, "H5Fcreate");
  const char* kind = getenv("SOAK_LEAK");
  if (kind && strcmp(kind, "rss") == 0) {
    const size_t bytes = (size_t)atoi(getenv("SOAK_LEAK_KB") ? getenv("SOAK_LEAK_KB") : "64") * 1024;
    static char* volatile kept;
    char* block = malloc(bytes);
    memset(block, 1, bytes);
    kept = block;  // a volatile store: the compiler cannot elide the leak
    (void)kept;
  } else if (kind && strcmp(kind, "fd") == 0) {
    open("/dev/null", O_RDONLY);
  }
  return real(name, flags, create, access);
}
