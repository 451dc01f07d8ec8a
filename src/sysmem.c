/* Memory left to this process: /proc/meminfo and the memory cgroup. */
#include "sysmem.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

unsigned long long lmx_file_value(const char *path, const char *key, unsigned long long unit)
{
    FILE *f = fopen(path, "r");
    char line[256];
    unsigned long long v = 0;
    size_t klen = strlen(key);
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) != 0)
            continue;
        if (sscanf(line + klen, " %llu", &v) != 1)
            v = 0;
        break;
    }
    if (f)
        fclose(f);
    return v > UINT64_MAX / unit ? 0 : v * unit;
}

/* What cgroup dir's limit leaves, if it has one (lowers *room): v2 names
 * the files memory.max, memory.current and inactive_file, v1
 * memory.limit_in_bytes, memory.usage_in_bytes and total_inactive_file
 * (no limit there is a number near 2^63). */
static void group_room(const char *dir, int v1, unsigned long long *room)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, v1 ? "memory.limit_in_bytes" : "memory.max");
    unsigned long long limit = lmx_file_value(path, "", 1);
    if (limit == 0 || limit >= (1ull << 62))
        return;
    snprintf(path, sizeof path, "%s/%s", dir, v1 ? "memory.usage_in_bytes" : "memory.current");
    unsigned long long used = lmx_file_value(path, "", 1);
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    unsigned long long cache = lmx_file_value(path, v1 ? "total_inactive_file" : "inactive_file", 1);
    used = cache < used ? used - cache : 0;
    unsigned long long left = used < limit ? limit - used : 0;
    if (left < *room)
        *room = left;
}

/* The group at path under mount and every group above it up to mount. A
 * path that is not there (a cgroup namespace shows the process's own group
 * as the mount's root) is taken as the root. */
static void groups_room(const char *mount, const char *path, int v1, unsigned long long *room)
{
    char dir[4096];
    struct stat st;
    size_t root_len = strlen(mount);
    int n = snprintf(dir, sizeof dir, "%s%s", mount, strcmp(path, "/") ? path : "");
    if (n < 0 || (size_t)n >= sizeof dir || stat(dir, &st) != 0)
        snprintf(dir, sizeof dir, "%s", mount);
    for (;;) { /* dir is mount and a path that starts with '/' */
        group_room(dir, v1, room);
        if (strlen(dir) <= root_len)
            break;
        *strrchr(dir, '/') = 0;
    }
}

size_t lmx_mem_available_at(const char *meminfo, const char *self_cgroup, const char *root)
{
    unsigned long long room = lmx_file_value(meminfo, "MemAvailable:", 1024);
    if (room == 0)
        room = UINT64_MAX;
    FILE *f = fopen(self_cgroup, "r");
    char line[4096];
    char v1_mount[4096];
    snprintf(v1_mount, sizeof v1_mount, "%s/memory", root);
    while (f && fgets(line, sizeof line, f)) { /* "id:controllers:path"; v2's is "0::path" */
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/')
            continue;
        *c2 = 0;
        if (!strcmp(line, "0:"))
            groups_room(root, c2 + 1, 0, &room);
        else if (strstr(c1 + 1, "memory"))
            groups_room(v1_mount, c2 + 1, 1, &room);
    }
    if (f)
        fclose(f);
    return room >= SIZE_MAX ? SIZE_MAX : (size_t)room;
}

size_t lmx_mem_available(void) { return lmx_mem_available_at("/proc/meminfo", "/proc/self/cgroup", "/sys/fs/cgroup"); }
