/* lmx_mem_available_at on cgroup trees laid out as the kernel does (v2 and
 * v1 files, a namespaced path, limits on a parent, no limit, unreadable
 * values), and lmx_mem_available on this machine. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sysmem.h"
#include "testutil.h"

#define GIB (1024ull * 1024 * 1024)

static char base[64];

/* Writes text to base/rel, making the folders on the way. */
static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", base, rel);
    for (char *p = path + strlen(base) + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static size_t avail(const char *cgroup_list)
{
    char meminfo[128], self[128], root[128];
    snprintf(meminfo, sizeof meminfo, "%s/meminfo", base);
    snprintf(self, sizeof self, "%s/self_cgroup", base);
    snprintf(root, sizeof root, "%s/cg", base);
    put("self_cgroup", cgroup_list);
    return lmx_mem_available_at(meminfo, self, root);
}

static void expect(size_t got, unsigned long long want, const char *what)
{
    CHECK(got == want, "%s: %zu bytes available, want %llu", what, got, want);
}

int main(void)
{
    snprintf(base, sizeof base, "/tmp/lmx-sysmem-%d", (int)getpid());
    mkdir(base, 0755);
    put("meminfo", "MemTotal:       32000000 kB\nMemFree:         1000 kB\nMemAvailable:   24000000 kB\n");
    unsigned long long host = 24000000ull * 1024;
    expect(avail(""), host, "no cgroup file lines");

    /* v2: a limit of 8 GiB with 1 GiB used, half of it inactive file cache */
    put("cg/a/b/memory.max", "8589934592\n");
    put("cg/a/b/memory.current", "1073741824\n");
    put("cg/a/b/memory.stat", "anon 536870912\nfile 536870912\nactive_file 0\ninactive_file 536870912\n");
    put("cg/a/memory.max", "max\n");
    expect(avail("0::/a/b\n"), 8 * GIB - GIB / 2, "v2 limit");
    /* a tighter limit on the parent */
    put("cg/a/memory.max", "4294967296\n");
    put("cg/a/memory.current", "3221225472\n");
    expect(avail("0::/a/b\n"), GIB, "v2 parent's limit");
    /* more used than the limit: nothing left */
    put("cg/a/memory.current", "5368709120\n");
    expect(avail("0::/a/b\n"), 0, "v2 over the limit");
    /* a namespaced path (not under the mount): the mount's root is the group */
    put("cg/memory.max", "3221225472\n");
    put("cg/memory.current", "1073741824\n");
    expect(avail("0::/elsewhere/x\n"), 2 * GIB, "v2 namespaced");

    /* v1: the memory controller's own hierarchy; others ignored */
    put("cg/memory/c/memory.limit_in_bytes", "2147483648\n");
    put("cg/memory/c/memory.usage_in_bytes", "1073741824\n");
    put("cg/memory/c/memory.stat", "cache 0\ntotal_cache 600\ntotal_inactive_file 536870912\n");
    put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n"); /* no limit */
    expect(avail("5:cpu,cpuacct:/c\n4:memory:/c\n1:name=systemd:/\n"), 2 * GIB - GIB / 2, "v1 limit");
    put("cg/memory/c/memory.limit_in_bytes", "9223372036854771712\n");
    expect(avail("4:memory:/c\n"), host, "v1 without a limit");
    put("cg/memory/c/memory.limit_in_bytes", "lots\n");
    expect(avail("4:memory:/c\n"), host, "v1 unreadable limit");

    /* no meminfo and no limit: unknown */
    put("meminfo", "MemTotal: 1 kB\n");
    expect(avail("4:memory:/c\n"), SIZE_MAX, "nothing known");
    put("cg/memory/c/memory.limit_in_bytes", "2147483648\n");
    expect(avail("4:memory:/c\n"), 2 * GIB - GIB / 2, "a limit without meminfo");

    size_t here = lmx_mem_available();
    CHECK(here > 0, "this machine: %zu bytes available", here);
    printf("this machine: %.1f GB available\n", here == SIZE_MAX ? -1.0 : (double)here / 1e9);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    CHECK(system(cmd) == 0, "cleanup of %s", base);
    return test_finish();
}
